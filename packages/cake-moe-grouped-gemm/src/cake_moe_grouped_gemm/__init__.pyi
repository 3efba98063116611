"""Type stub of the legacy name cake_moe_grouped_gemm.

``from cake_moe_grouped_gemm import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_moe_grouped_gemm import <old spelling>`` works); a star import does not bind it.
"""

from cake_moe_grouped_det_gemm import MoEFeedForward as MoEFeedForward
from cake_moe_grouped_det_gemm import MoEFeedForwardPlans as MoEFeedForwardPlans
from cake_moe_grouped_det_gemm import MoEGroupedDetGrads as MoEGroupedDetGrads
from cake_moe_grouped_det_gemm import MoEGroupedDetPlan as MoEGroupedDetPlan
from cake_moe_grouped_det_gemm import MoEGroupedDetSavedSet as MoEGroupedDetSavedSet
from cake_moe_grouped_det_gemm import MoEGroupedDetWorkspace as MoEGroupedDetWorkspace
from cake_moe_grouped_det_gemm import MoERouting as MoERouting
from cake_moe_grouped_det_gemm import __version__ as __version__
from cake_moe_grouped_det_gemm import is_supported as is_supported
from cake_moe_grouped_det_gemm import make_moe_plans as make_moe_plans
from cake_moe_grouped_det_gemm import make_plan as make_plan
from cake_moe_grouped_det_gemm import moe_experts_det as moe_experts_det
from cake_moe_grouped_det_gemm import moe_feed_forward_det as moe_feed_forward_det
from cake_moe_grouped_det_gemm import moe_feed_forward_is_supported as moe_feed_forward_is_supported
from cake_moe_grouped_det_gemm import moe_feed_forward_reference as moe_feed_forward_reference
from cake_moe_grouped_det_gemm import moe_feed_forward_saved_bytes as moe_feed_forward_saved_bytes
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm as moe_grouped_det_gemm
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_bwd as moe_grouped_det_gemm_bwd
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_fwd as moe_grouped_det_gemm_fwd
from cake_moe_grouped_det_gemm import moe_grouped_gemm_reference as moe_grouped_gemm_reference
from cake_moe_grouped_det_gemm import moe_permute_det as moe_permute_det
from cake_moe_grouped_det_gemm import moe_route_det as moe_route_det
from cake_moe_grouped_det_gemm import moe_topk_det as moe_topk_det
from cake_moe_grouped_det_gemm import moe_unpermute_det as moe_unpermute_det
from cake_moe_grouped_det_gemm import saved_bytes as saved_bytes
from cake_moe_grouped_det_gemm import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
MoEGroupedGrads = MoEGroupedDetGrads
MoEGroupedPlan = MoEGroupedDetPlan
MoEGroupedSavedSet = MoEGroupedDetSavedSet
MoEGroupedWorkspace = MoEGroupedDetWorkspace
moe_experts = moe_experts_det
moe_feed_forward = moe_feed_forward_det
moe_grouped_gemm = moe_grouped_det_gemm
moe_grouped_gemm_bwd = moe_grouped_det_gemm_bwd
moe_grouped_gemm_fwd = moe_grouped_det_gemm_fwd
moe_permute = moe_permute_det
moe_route = moe_route_det
moe_topk = moe_topk_det
moe_unpermute = moe_unpermute_det

__all__ = [
    "MoEFeedForward",
    "MoEFeedForwardPlans",
    "MoEGroupedDetGrads",
    "MoEGroupedDetPlan",
    "MoEGroupedDetSavedSet",
    "MoEGroupedDetWorkspace",
    "MoERouting",
    "__version__",
    "is_supported",
    "make_moe_plans",
    "make_plan",
    "moe_experts_det",
    "moe_feed_forward_det",
    "moe_feed_forward_is_supported",
    "moe_feed_forward_reference",
    "moe_feed_forward_saved_bytes",
    "moe_grouped_det_gemm",
    "moe_grouped_det_gemm_bwd",
    "moe_grouped_det_gemm_fwd",
    "moe_grouped_gemm_reference",
    "moe_permute_det",
    "moe_route_det",
    "moe_topk_det",
    "moe_unpermute_det",
    "saved_bytes",
    "workspace_bytes",
]
