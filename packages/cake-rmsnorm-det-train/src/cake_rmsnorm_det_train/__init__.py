"""cake-rmsnorm-det-train: deterministic RMSNorm forward and backward in Triton.

y = x * rsqrt(mean(x**2, dim=-1) + eps) * weight  (Zhang & Sennrich, 2019,
"Root Mean Square Layer Normalization"), with an optional fused residual add.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "rmsnorm_det": "api",
    "rmsnorm_det_fwd": "api",
    "rmsnorm_det_bwd": "api",
    "RMSNormDetGrads": "api",
    "RMSNorm": "modules",
    "RMSNormDetPlan": "plan",
    "make_plan": "plan",
    "RMSNormDetSavedSet": "saved",
    "RMSNormDetWorkspace": "saved",
    "rmsnorm_reference": "reference",
    "is_supported": "queries",
    "workspace_bytes": "queries",
    "saved_bytes": "queries",
}

__all__ = [
    "RMSNorm",
    "RMSNormDetGrads",
    "RMSNormDetPlan",
    "RMSNormDetSavedSet",
    "RMSNormDetWorkspace",
    "__version__",
    "is_supported",
    "make_plan",
    "rmsnorm_det",
    "rmsnorm_det_bwd",
    "rmsnorm_det_fwd",
    "rmsnorm_reference",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_rmsnorm_det_train.api import (
        RMSNormDetGrads,
        rmsnorm_det,
        rmsnorm_det_bwd,
        rmsnorm_det_fwd,
    )
    from cake_rmsnorm_det_train.modules import RMSNorm
    from cake_rmsnorm_det_train.plan import RMSNormDetPlan, make_plan
    from cake_rmsnorm_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_rmsnorm_det_train.reference import rmsnorm_reference
    from cake_rmsnorm_det_train.saved import RMSNormDetSavedSet, RMSNormDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
