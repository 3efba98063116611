"""cake-dense-projection-nondet-gemm: dense projection (``nn.Linear``) in Triton, bits not
promised: the nondet sibling of cake-dense-projection-det-gemm.

y = x · weightᵀ + bias, with dx = dy · W, dW = dyᵀ · x (optionally added into Megatron's
fp32 ``main_grad``) and dbias = Σ_tokens dy. It runs cake-dense-projection-det-gemm's
kernels today, with plans, saved sets and workspaces of mode ``nondet``; its backward
raises under ``torch.use_deterministic_algorithms(True)``.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "dense_projection_nondet": "api",
    "dense_projection_nondet_fwd": "api",
    "dense_projection_nondet_bwd": "api",
    "DenseProjectionNondetGrads": "api",
    "LinearNondet": "modules",
    "DenseProjectionNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "DenseProjectionNondetSavedSet": "saved",
    "DenseProjectionNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "DenseProjectionNondetGrads",
    "DenseProjectionNondetPlan",
    "DenseProjectionNondetSavedSet",
    "DenseProjectionNondetWorkspace",
    "LinearNondet",
    "__version__",
    "dense_projection_nondet",
    "dense_projection_nondet_bwd",
    "dense_projection_nondet_fwd",
    "is_supported_nondet",
    "make_nondet_plan",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_dense_projection_nondet_gemm.api import (
        DenseProjectionNondetGrads,
        dense_projection_nondet,
        dense_projection_nondet_bwd,
        dense_projection_nondet_fwd,
    )
    from cake_dense_projection_nondet_gemm.modules import LinearNondet
    from cake_dense_projection_nondet_gemm.plan import DenseProjectionNondetPlan, make_nondet_plan
    from cake_dense_projection_nondet_gemm.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_dense_projection_nondet_gemm.saved import (
        DenseProjectionNondetSavedSet,
        DenseProjectionNondetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
