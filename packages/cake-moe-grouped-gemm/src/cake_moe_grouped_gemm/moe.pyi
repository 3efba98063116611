"""Type stub of the legacy name cake_moe_grouped_gemm.moe:

cake_moe_grouped_det_gemm.moe itself.
"""

from cake_moe_grouped_det_gemm.moe import *  # noqa: F403
