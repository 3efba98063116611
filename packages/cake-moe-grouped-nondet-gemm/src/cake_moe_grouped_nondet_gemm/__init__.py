"""cake-moe-grouped-nondet-gemm: MoE grouped GEMM (stacked expert weights) in Triton, bits
not promised: the nondet sibling of cake-moe-grouped-det-gemm.

x ``[M, K]`` holds tokens sorted by expert; expert e owns rows ``[offs[e-1], offs[e])``:
y[rows of e] = x[rows of e] · weight[e]ᵀ, dx[rows of e] = dy · weight[e],
dW[e] = dy[rows of e]ᵀ · x[rows of e] (optionally added into Megatron's fp32
``main_grad``). It runs cake-moe-grouped-det-gemm's kernels today, with plans, saved sets
and workspaces of mode ``nondet``; its backward raises under
``torch.use_deterministic_algorithms(True)``. :class:`MoEFeedForwardNondet` is the MoE
feed-forward layer on it.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "moe_grouped_nondet_gemm": "api",
    "moe_grouped_nondet_gemm_fwd": "api",
    "moe_grouped_nondet_gemm_bwd": "api",
    "MoEGroupedNondetGrads": "api",
    "MoEGroupedNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "MoEGroupedNondetSavedSet": "saved",
    "MoEGroupedNondetWorkspace": "saved",
    "MoEFeedForwardNondet": "moe",
    "MoEFeedForwardNondetPlans": "moe",
    "MoERoutingNondet": "moe",
    "make_nondet_moe_plans": "moe",
    "moe_experts_nondet": "moe",
    "moe_feed_forward_nondet": "moe",
    "moe_permute_nondet": "moe",
    "moe_route_nondet": "moe",
    "moe_topk_nondet": "moe",
    "moe_unpermute_nondet": "moe",
    "is_supported_nondet": "queries",
    "moe_feed_forward_is_supported_nondet": "queries",
    "moe_feed_forward_saved_bytes_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "MoEGroupedNondetGrads",
    "MoEGroupedNondetPlan",
    "MoEGroupedNondetSavedSet",
    "MoEGroupedNondetWorkspace",
    "MoEFeedForwardNondet",
    "MoEFeedForwardNondetPlans",
    "MoERoutingNondet",
    "__version__",
    "is_supported_nondet",
    "make_nondet_moe_plans",
    "make_nondet_plan",
    "moe_feed_forward_is_supported_nondet",
    "moe_experts_nondet",
    "moe_feed_forward_nondet",
    "moe_feed_forward_saved_bytes_nondet",
    "moe_grouped_nondet_gemm",
    "moe_grouped_nondet_gemm_bwd",
    "moe_grouped_nondet_gemm_fwd",
    "moe_permute_nondet",
    "moe_route_nondet",
    "moe_topk_nondet",
    "moe_unpermute_nondet",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_moe_grouped_nondet_gemm.api import (
        MoEGroupedNondetGrads,
        moe_grouped_nondet_gemm,
        moe_grouped_nondet_gemm_bwd,
        moe_grouped_nondet_gemm_fwd,
    )
    from cake_moe_grouped_nondet_gemm.moe import (
        MoEFeedForwardNondet,
        MoEFeedForwardNondetPlans,
        MoERoutingNondet,
        make_nondet_moe_plans,
        moe_experts_nondet,
        moe_feed_forward_nondet,
        moe_permute_nondet,
        moe_route_nondet,
        moe_topk_nondet,
        moe_unpermute_nondet,
    )
    from cake_moe_grouped_nondet_gemm.plan import MoEGroupedNondetPlan, make_nondet_plan
    from cake_moe_grouped_nondet_gemm.queries import (
        is_supported_nondet,
        moe_feed_forward_is_supported_nondet,
        moe_feed_forward_saved_bytes_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_moe_grouped_nondet_gemm.saved import (
        MoEGroupedNondetSavedSet,
        MoEGroupedNondetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
