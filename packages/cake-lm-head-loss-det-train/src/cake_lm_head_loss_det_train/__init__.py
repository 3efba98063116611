"""cake-lm-head-loss-det-train: deterministic fused LM head + cross entropy in Triton.

loss = cross_entropy(hidden @ weight.T (+ bias), labels), computed over token chunks so
the whole ``[T, V]`` logits never exist, with label smoothing, z-loss (PaLM) and tanh
logit soft-capping (Gemma 2), and bitwise repeatable gradients.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "lm_head_loss_det": "api",
    "lm_head_loss_det_fwd": "api",
    "lm_head_loss_det_bwd": "api",
    "LMHeadLossDetGrads": "api",
    "LMHeadLoss": "modules",
    "LMHeadLossDetPlan": "plan",
    "make_plan": "plan",
    "LMHeadLossDetSavedSet": "saved",
    "LMHeadLossDetWorkspace": "saved",
    "lm_head_loss_reference": "reference",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "LMHeadLoss",
    "LMHeadLossDetGrads",
    "LMHeadLossDetPlan",
    "LMHeadLossDetSavedSet",
    "LMHeadLossDetWorkspace",
    "__version__",
    "is_supported",
    "lm_head_loss_det",
    "lm_head_loss_det_bwd",
    "lm_head_loss_det_fwd",
    "lm_head_loss_reference",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_lm_head_loss_det_train.api import (
        LMHeadLossDetGrads,
        lm_head_loss_det,
        lm_head_loss_det_bwd,
        lm_head_loss_det_fwd,
    )
    from cake_lm_head_loss_det_train.modules import LMHeadLoss
    from cake_lm_head_loss_det_train.plan import LMHeadLossDetPlan, make_plan
    from cake_lm_head_loss_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_lm_head_loss_det_train.reference import lm_head_loss_reference
    from cake_lm_head_loss_det_train.saved import LMHeadLossDetSavedSet, LMHeadLossDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
