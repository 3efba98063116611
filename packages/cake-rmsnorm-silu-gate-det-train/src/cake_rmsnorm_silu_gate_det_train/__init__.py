"""cake-rmsnorm-silu-gate-det-train: deterministic gated RMSNorm forward and backward in Triton.

RMSNorm with an output gate, ``gate(z) = silu(z)`` (``activation="silu"`` / ``"swish"``,
the default) or ``sigmoid(z)`` (``activation="sigmoid"``, Kimi Delta Attention), in the two
orders models use:

- ``norm_before_gate=True`` (FLA ``FusedRMSNormGated`` / ``rms_norm_gated``, Qwen3-Next, KDA):
  ``y = rmsnorm(x) * weight * gate(z)``;
- ``norm_before_gate=False`` (Mamba2 ``RMSNormGated``): ``y = rmsnorm(x * gate(z)) * weight``;

with ``rmsnorm(u) = u * rsqrt(mean(u**2) + eps)`` over the last dim or over contiguous
groups of ``group_size`` in it. dweight is summed in a fixed order (bitwise repeatable).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "rmsnorm_silu_gate_det": "api",
    "rmsnorm_silu_gate_det_fwd": "api",
    "rmsnorm_silu_gate_det_bwd": "api",
    "RMSNormSiluGateDetGrads": "api",
    "RMSNormGated": "modules",
    "RMSNormSiluGateDetPlan": "plan",
    "make_plan": "plan",
    "RMSNormSiluGateDetSavedSet": "saved",
    "RMSNormSiluGateDetWorkspace": "saved",
    "rmsnorm_silu_gate_reference": "reference",
    "is_supported": "queries",
    "workspace_bytes": "queries",
    "saved_bytes": "queries",
}

__all__ = [
    "RMSNormGated",
    "RMSNormSiluGateDetGrads",
    "RMSNormSiluGateDetPlan",
    "RMSNormSiluGateDetSavedSet",
    "RMSNormSiluGateDetWorkspace",
    "__version__",
    "is_supported",
    "make_plan",
    "rmsnorm_silu_gate_det",
    "rmsnorm_silu_gate_det_bwd",
    "rmsnorm_silu_gate_det_fwd",
    "rmsnorm_silu_gate_reference",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_rmsnorm_silu_gate_det_train.api import (
        RMSNormSiluGateDetGrads,
        rmsnorm_silu_gate_det,
        rmsnorm_silu_gate_det_bwd,
        rmsnorm_silu_gate_det_fwd,
    )
    from cake_rmsnorm_silu_gate_det_train.modules import RMSNormGated
    from cake_rmsnorm_silu_gate_det_train.plan import RMSNormSiluGateDetPlan, make_plan
    from cake_rmsnorm_silu_gate_det_train.queries import (
        is_supported,
        saved_bytes,
        workspace_bytes,
    )
    from cake_rmsnorm_silu_gate_det_train.reference import rmsnorm_silu_gate_reference
    from cake_rmsnorm_silu_gate_det_train.saved import (
        RMSNormSiluGateDetSavedSet,
        RMSNormSiluGateDetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
