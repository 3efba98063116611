"""Type stub of the legacy name cake_moe_grouped_gemm.api:

cake_moe_grouped_det_gemm.api itself.
"""

from cake_moe_grouped_det_gemm.api import *  # noqa: F403
