"""Type stub of the legacy name cake_moe_grouped_gemm.reference:

cake_moe_grouped_det_gemm.reference itself.
"""

from cake_moe_grouped_det_gemm.reference import *  # noqa: F403
