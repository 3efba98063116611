"""cake-dense-projection-det-gemm: deterministic dense projection (``nn.Linear``) in Triton.

y = x · weightᵀ + bias, with dx = dy · W, dW = dyᵀ · x (deterministic split-K over tokens,
optionally added into Megatron's fp32 ``main_grad``) and dbias = Σ_tokens dy.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "dense_projection_det": "api",
    "dense_projection_det_fwd": "api",
    "dense_projection_det_bwd": "api",
    "DenseProjectionDetGrads": "api",
    "Linear": "modules",
    "DenseProjectionDetPlan": "plan",
    "make_plan": "plan",
    "DenseProjectionDetSavedSet": "saved",
    "DenseProjectionDetWorkspace": "saved",
    "dense_projection_reference": "reference",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "DenseProjectionDetGrads",
    "DenseProjectionDetPlan",
    "DenseProjectionDetSavedSet",
    "DenseProjectionDetWorkspace",
    "Linear",
    "__version__",
    "dense_projection_det",
    "dense_projection_det_bwd",
    "dense_projection_det_fwd",
    "dense_projection_reference",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_dense_projection_det_gemm.api import (
        DenseProjectionDetGrads,
        dense_projection_det,
        dense_projection_det_bwd,
        dense_projection_det_fwd,
    )
    from cake_dense_projection_det_gemm.modules import Linear
    from cake_dense_projection_det_gemm.plan import DenseProjectionDetPlan, make_plan
    from cake_dense_projection_det_gemm.queries import is_supported, saved_bytes, workspace_bytes
    from cake_dense_projection_det_gemm.reference import dense_projection_reference
    from cake_dense_projection_det_gemm.saved import (
        DenseProjectionDetSavedSet,
        DenseProjectionDetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
