"""CausalConv1dNondetSavedSet and CausalConv1dNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

from typing import ClassVar

from cake_causal_conv1d_det_train.saved import CausalConv1dDetWorkspace
from cake_core import Mode, SavedSet

from cake_causal_conv1d_nondet_train.plan import CausalConv1dNondetPlan


class CausalConv1dNondetSavedSet(SavedSet):
    """What :func:`~cake_causal_conv1d_nondet_train.causal_conv1d_nondet_fwd` keeps for
    :func:`~cake_causal_conv1d_nondet_train.causal_conv1d_nondet_bwd` (mode ``nondet``):
    the tensors and meta of cake-causal-conv1d-det-train's ``CausalConv1dDetSavedSet``.

    Tensors: x ``[B, T, D]``, weight ``[D, W]``, bias ``[D]`` or None, initial_state
    ``[N, D, W - 1]`` or None, cu_seqlens ``[N + 1]`` or None. Meta: ``activation``,
    ``plan`` (a :class:`CausalConv1dNondetPlan`), ``offsets`` (CPU int64), ``n_seqs``.
    A det backward refuses it, and this package's backward refuses the det one.
    """

    tensor_names = ("x", "weight", "bias", "initial_state", "cu_seqlens")
    format_version = 1


class CausalConv1dNondetWorkspace(CausalConv1dDetWorkspace):
    """The backward's reusable fp32 partials for one :class:`CausalConv1dNondetPlan` (mode
    ``nondet``): the buffers of ``CausalConv1dDetWorkspace`` (``dweight_partials``,
    ``dbias_partials``, and ``da_scratch`` with ``plan.bwd_da_once``). Build with
    ``CausalConv1dNondetWorkspace.for_plan(plan, device, *, max_tokens, max_seqs=1)``; it
    refuses a det plan, and det entries refuse this workspace.
    """

    plan_class: ClassVar[type] = CausalConv1dNondetPlan


__all__ = ["CausalConv1dNondetSavedSet", "CausalConv1dNondetWorkspace", "Mode"]
