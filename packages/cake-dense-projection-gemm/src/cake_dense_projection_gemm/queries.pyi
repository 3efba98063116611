"""Type stub of the legacy name cake_dense_projection_gemm.queries:

cake_dense_projection_det_gemm.queries itself.
"""

from cake_dense_projection_det_gemm.queries import *  # noqa: F403
