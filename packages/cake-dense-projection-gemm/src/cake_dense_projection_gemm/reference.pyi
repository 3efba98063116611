"""Type stub of the legacy name cake_dense_projection_gemm.reference:

cake_dense_projection_det_gemm.reference itself.
"""

from cake_dense_projection_det_gemm.reference import *  # noqa: F403
