"""cake-moe-grouped-det-gemm: deterministic MoE grouped GEMM (stacked expert weights) in Triton.

x ``[M, K]`` holds tokens sorted by expert; expert e owns rows ``[offs[e-1], offs[e])``:
y[rows of e] = x[rows of e] · weight[e]ᵀ, dx[rows of e] = dy · weight[e],
dW[e] = dy[rows of e]ᵀ · x[rows of e] (deterministic split-K over rows, optionally added
into Megatron's fp32 ``main_grad``). The offsets are read on the device only (no host sync).

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
}

__all__ = [
    "MoEGroupedDetGrads",
    "MoEGroupedDetPlan",
    "MoEGroupedDetSavedSet",
    "MoEGroupedDetWorkspace",
    "__version__",
    "make_plan",
    "moe_grouped_det_gemm",
    "moe_grouped_det_gemm_bwd",
    "moe_grouped_det_gemm_fwd",
    "moe_grouped_gemm_reference",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_moe_grouped_det_gemm.api import (
        MoEGroupedDetGrads,
        moe_grouped_det_gemm,
        moe_grouped_det_gemm_bwd,
        moe_grouped_det_gemm_fwd,
    )
    from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan, make_plan
    from cake_moe_grouped_det_gemm.reference import moe_grouped_gemm_reference
    from cake_moe_grouped_det_gemm.saved import MoEGroupedDetSavedSet, MoEGroupedDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
