"""Type stub of the legacy name cake_moe_grouped_gemm.saved:

cake_moe_grouped_det_gemm.saved itself.
"""

from cake_moe_grouped_det_gemm.saved import *  # noqa: F403
