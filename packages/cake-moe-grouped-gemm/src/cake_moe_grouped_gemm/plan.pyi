"""Type stub of the legacy name cake_moe_grouped_gemm.plan:

cake_moe_grouped_det_gemm.plan itself.
"""

from cake_moe_grouped_det_gemm.plan import *  # noqa: F403
