"""cake-lm-head-loss-nondet-train: fused LM head + cross entropy in Triton, with bits not
promised repeatable (the non-deterministic sibling of cake-lm-head-loss-det-train).

loss = cross_entropy(hidden @ weight.T (+ bias), labels) over token chunks, so the whole
``[T, V]`` logits never exist, with label smoothing, z-loss and logit soft-capping. Today it
runs cake-lm-head-loss-det-train's kernels and launches under its own plan, saved set,
workspace and custom ops (mode ``nondet``); its speed is the det sibling's.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "lm_head_loss_nondet": "api",
    "lm_head_loss_nondet_fwd": "api",
    "lm_head_loss_nondet_bwd": "api",
    "LMHeadLossNondetGrads": "api",
    "LMHeadLossNondet": "modules",
    "LMHeadLossNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "LMHeadLossNondetSavedSet": "saved",
    "LMHeadLossNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "LMHeadLossNondet",
    "LMHeadLossNondetGrads",
    "LMHeadLossNondetPlan",
    "LMHeadLossNondetSavedSet",
    "LMHeadLossNondetWorkspace",
    "__version__",
    "is_supported_nondet",
    "lm_head_loss_nondet",
    "lm_head_loss_nondet_bwd",
    "lm_head_loss_nondet_fwd",
    "make_nondet_plan",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_lm_head_loss_nondet_train.api import (
        LMHeadLossNondetGrads,
        lm_head_loss_nondet,
        lm_head_loss_nondet_bwd,
        lm_head_loss_nondet_fwd,
    )
    from cake_lm_head_loss_nondet_train.modules import LMHeadLossNondet
    from cake_lm_head_loss_nondet_train.plan import LMHeadLossNondetPlan, make_nondet_plan
    from cake_lm_head_loss_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_lm_head_loss_nondet_train.saved import (
        LMHeadLossNondetSavedSet,
        LMHeadLossNondetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
