"""LMHeadLossNondetSavedSet and LMHeadLossNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

from typing import ClassVar

from cake_core import Mode, SavedSet
from cake_lm_head_loss_det_train.saved import LMHeadLossDetWorkspace

from cake_lm_head_loss_nondet_train.plan import LMHeadLossNondetPlan


class LMHeadLossNondetSavedSet(SavedSet):
    """What :func:`~cake_lm_head_loss_nondet_train.lm_head_loss_nondet_fwd` keeps for
    :func:`~cake_lm_head_loss_nondet_train.lm_head_loss_nondet_bwd` (mode ``nondet``): the
    tensors and meta of cake-lm-head-loss-det-train's ``LMHeadLossDetSavedSet``.

    Tensors: hidden ``[T, H]``, weight ``[V, H]``, bias ``[V]`` or None, labels ``[T]``,
    lse fp32 ``[T]``, n_valid int64 ``[]``; with forward-computed gradients dhidden,
    dweight32 (or dlogits on the deferred route) and dbias32. Meta: ``plan`` (an
    :class:`LMHeadLossNondetPlan`), ``reduction``, ``ignore_index``, ``label_smoothing``,
    ``z_loss``, ``logit_softcap``, ``grad_in_forward``, ``lead_shape``, ``hidden_shape``.
    A det backward refuses it, and this package's backward refuses the det one.
    """

    tensor_names = ("hidden", "weight", "bias", "labels", "lse", "n_valid", "dhidden",
                    "dweight32", "dlogits", "dbias32")
    format_version = 1


class LMHeadLossNondetWorkspace(LMHeadLossDetWorkspace):
    """Chunk buffers for one :class:`LMHeadLossNondetPlan` and one input dtype (mode
    ``nondet``): the buffers of ``LMHeadLossDetWorkspace`` (fp32 ``logits``, ``dlogits``,
    ``dh_partials``). Build with ``LMHeadLossNondetWorkspace.for_plan(plan, device,
    dtype)``; it refuses a det plan, and det entries refuse this workspace.
    """

    plan_class: ClassVar[type] = LMHeadLossNondetPlan


__all__ = ["LMHeadLossNondetSavedSet", "LMHeadLossNondetWorkspace", "Mode"]
