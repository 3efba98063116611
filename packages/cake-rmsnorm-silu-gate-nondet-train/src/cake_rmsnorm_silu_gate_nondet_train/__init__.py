"""cake-rmsnorm-silu-gate-nondet-train: gated RMSNorm forward and backward in Triton, not
promised bitwise repeatable; the nondet sibling of cake-rmsnorm-silu-gate-det-train.

RMSNorm with an output gate, ``gate(z) = silu(z)`` or ``sigmoid(z)``, in FLA's order
(``y = rmsnorm(x) * weight * gate(z)``) or Mamba2's (``y = rmsnorm(x * gate(z)) *
weight``), over the last dim or contiguous groups of it.

It runs cake-rmsnorm-silu-gate-det-train's kernels today; its speed is the det sibling's
(not yet measured separately); its bits are not promised. Its plans, saved sets and
workspaces carry mode ``nondet``, and its backward raises under
``torch.use_deterministic_algorithms(True)``.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "rmsnorm_silu_gate_nondet": "api",
    "rmsnorm_silu_gate_nondet_fwd": "api",
    "rmsnorm_silu_gate_nondet_bwd": "api",
    "RMSNormSiluGateNondetGrads": "api",
    "RMSNormGatedNondet": "modules",
    "RMSNormSiluGateNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "RMSNormSiluGateNondetSavedSet": "saved",
    "RMSNormSiluGateNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "workspace_bytes_nondet": "queries",
    "saved_bytes_nondet": "queries",
}

__all__ = [
    "RMSNormGatedNondet",
    "RMSNormSiluGateNondetGrads",
    "RMSNormSiluGateNondetPlan",
    "RMSNormSiluGateNondetSavedSet",
    "RMSNormSiluGateNondetWorkspace",
    "__version__",
    "is_supported_nondet",
    "make_nondet_plan",
    "rmsnorm_silu_gate_nondet",
    "rmsnorm_silu_gate_nondet_bwd",
    "rmsnorm_silu_gate_nondet_fwd",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_rmsnorm_silu_gate_nondet_train.api import (
        RMSNormSiluGateNondetGrads,
        rmsnorm_silu_gate_nondet,
        rmsnorm_silu_gate_nondet_bwd,
        rmsnorm_silu_gate_nondet_fwd,
    )
    from cake_rmsnorm_silu_gate_nondet_train.modules import RMSNormGatedNondet
    from cake_rmsnorm_silu_gate_nondet_train.plan import RMSNormSiluGateNondetPlan, make_nondet_plan
    from cake_rmsnorm_silu_gate_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_rmsnorm_silu_gate_nondet_train.saved import (
        RMSNormSiluGateNondetSavedSet,
        RMSNormSiluGateNondetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
