"""cake-moe-grouped-det-gemm: deterministic MoE grouped GEMM (stacked expert weights) in Triton.

x ``[M, K]`` holds tokens sorted by expert; expert e owns rows ``[offs[e-1], offs[e])``:
y[rows of e] = x[rows of e] · weight[e]ᵀ, dx[rows of e] = dy · weight[e],
dW[e] = dy[rows of e]ᵀ · x[rows of e] (deterministic split-K over rows, optionally added
into Megatron's fp32 ``main_grad``). The offsets are read on the device only (no host sync).
``cake_moe_grouped_det_gemm.moe`` builds the MoE feed-forward layer on it
(:class:`MoEFeedForward`: top-k softmax router, SwiGLU experts, fixed-order combine).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "moe_grouped_det_gemm": "api",
    "moe_grouped_det_gemm_fwd": "api",
    "moe_grouped_det_gemm_bwd": "api",
    "MoEGroupedDetGrads": "api",
    "MoEGroupedDetPlan": "plan",
    "make_plan": "plan",
    "MoEGroupedDetSavedSet": "saved",
    "MoEGroupedDetWorkspace": "saved",
    "moe_grouped_gemm_reference": "reference",
    "moe_feed_forward_reference": "reference",
    "MoEFeedForward": "moe",
    "MoEFeedForwardPlans": "moe",
    "MoERouting": "moe",
    "make_moe_plans": "moe",
    "moe_experts_det": "moe",
    "moe_feed_forward_det": "moe",
    "moe_permute_det": "moe",
    "moe_route_det": "moe",
    "moe_topk_det": "moe",
    "moe_unpermute_det": "moe",
    "is_supported": "queries",
    "moe_feed_forward_is_supported": "queries",
    "moe_feed_forward_saved_bytes": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

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
    "moe_grouped_det_gemm",
    "moe_grouped_det_gemm_bwd",
    "moe_experts_det",
    "moe_feed_forward_det",
    "moe_feed_forward_is_supported",
    "moe_feed_forward_reference",
    "moe_feed_forward_saved_bytes",
    "moe_grouped_det_gemm_fwd",
    "moe_grouped_gemm_reference",
    "moe_permute_det",
    "moe_route_det",
    "moe_topk_det",
    "moe_unpermute_det",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_moe_grouped_det_gemm.api import (
        MoEGroupedDetGrads,
        moe_grouped_det_gemm,
        moe_grouped_det_gemm_bwd,
        moe_grouped_det_gemm_fwd,
    )
    from cake_moe_grouped_det_gemm.moe import (
        MoEFeedForward,
        MoEFeedForwardPlans,
        MoERouting,
        make_moe_plans,
        moe_experts_det,
        moe_feed_forward_det,
        moe_permute_det,
        moe_route_det,
        moe_topk_det,
        moe_unpermute_det,
    )
    from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan, make_plan
    from cake_moe_grouped_det_gemm.queries import (
        is_supported,
        moe_feed_forward_is_supported,
        moe_feed_forward_saved_bytes,
        saved_bytes,
        workspace_bytes,
    )
    from cake_moe_grouped_det_gemm.reference import (
        moe_feed_forward_reference,
        moe_grouped_gemm_reference,
    )
    from cake_moe_grouped_det_gemm.saved import MoEGroupedDetSavedSet, MoEGroupedDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
