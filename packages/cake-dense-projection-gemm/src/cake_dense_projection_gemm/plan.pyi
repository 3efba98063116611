"""Type stub of the legacy name cake_dense_projection_gemm.plan:

cake_dense_projection_det_gemm.plan itself.
"""

from cake_dense_projection_det_gemm.plan import *  # noqa: F403
