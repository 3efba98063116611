"""cake-rmsnorm-nondet-train: RMSNorm forward and backward in Triton, not promised bitwise
repeatable; the nondet sibling of cake-rmsnorm-det-train.

y = x * rsqrt(mean(x**2, dim=-1) + eps) * weight  (Zhang & Sennrich, 2019,
"Root Mean Square Layer Normalization"), with an optional fused residual add.

It runs cake-rmsnorm-det-train's kernels today; its speed is the det sibling's (not yet
measured separately); its bits are not promised. Its plans, saved sets and workspaces
carry mode ``nondet``, and its backward raises under
``torch.use_deterministic_algorithms(True)``.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "rmsnorm_nondet": "api",
    "rmsnorm_nondet_fwd": "api",
    "rmsnorm_nondet_bwd": "api",
    "RMSNormNondetGrads": "api",
    "RMSNormNondet": "modules",
    "RMSNormNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "RMSNormNondetSavedSet": "saved",
    "RMSNormNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "workspace_bytes_nondet": "queries",
    "saved_bytes_nondet": "queries",
}

__all__ = [
    "RMSNormNondet",
    "RMSNormNondetGrads",
    "RMSNormNondetPlan",
    "RMSNormNondetSavedSet",
    "RMSNormNondetWorkspace",
    "__version__",
    "is_supported_nondet",
    "make_nondet_plan",
    "rmsnorm_nondet",
    "rmsnorm_nondet_bwd",
    "rmsnorm_nondet_fwd",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_rmsnorm_nondet_train.api import (
        RMSNormNondetGrads,
        rmsnorm_nondet,
        rmsnorm_nondet_bwd,
        rmsnorm_nondet_fwd,
    )
    from cake_rmsnorm_nondet_train.modules import RMSNormNondet
    from cake_rmsnorm_nondet_train.plan import RMSNormNondetPlan, make_nondet_plan
    from cake_rmsnorm_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_rmsnorm_nondet_train.saved import RMSNormNondetSavedSet, RMSNormNondetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
