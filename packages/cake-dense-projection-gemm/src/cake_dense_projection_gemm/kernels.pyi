"""Type stub of the legacy name cake_dense_projection_gemm.kernels:

cake_dense_projection_det_gemm.kernels itself.
"""

from cake_dense_projection_det_gemm.kernels import *  # noqa: F403
