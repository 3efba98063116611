"""Type stub of the legacy name cake_moe_grouped_gemm.kernels:

cake_moe_grouped_det_gemm.kernels itself.
"""

from cake_moe_grouped_det_gemm.kernels import *  # noqa: F403
