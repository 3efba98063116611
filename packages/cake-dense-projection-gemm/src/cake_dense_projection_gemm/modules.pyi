"""Type stub of the legacy name cake_dense_projection_gemm.modules:

cake_dense_projection_det_gemm.modules itself.
"""

from cake_dense_projection_det_gemm.modules import *  # noqa: F403
