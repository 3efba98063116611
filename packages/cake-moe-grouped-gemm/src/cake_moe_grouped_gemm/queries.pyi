"""Type stub of the legacy name cake_moe_grouped_gemm.queries:

cake_moe_grouped_det_gemm.queries itself.
"""

from cake_moe_grouped_det_gemm.queries import *  # noqa: F403
