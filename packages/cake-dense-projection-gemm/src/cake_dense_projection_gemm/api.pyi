"""Type stub of the legacy name cake_dense_projection_gemm.api:

cake_dense_projection_det_gemm.api itself.
"""

from cake_dense_projection_det_gemm.api import *  # noqa: F403
