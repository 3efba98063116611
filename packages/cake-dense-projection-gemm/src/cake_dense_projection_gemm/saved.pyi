"""Type stub of the legacy name cake_dense_projection_gemm.saved:

cake_dense_projection_det_gemm.saved itself.
"""

from cake_dense_projection_det_gemm.saved import *  # noqa: F403
