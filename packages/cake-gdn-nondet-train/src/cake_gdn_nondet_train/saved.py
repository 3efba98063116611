"""GDNNondetSavedSet and GDNNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

from typing import ClassVar

from cake_core import SavedSet
from cake_gdn_det_train.saved import GDNDetSavedSet, GDNDetWorkspace

from cake_gdn_nondet_train.plan import GDNNondetPlan


class GDNNondetSavedSet(SavedSet):
    """What :func:`~cake_gdn_nondet_train.chunk_gdn_nondet_fwd` keeps for
    :func:`~cake_gdn_nondet_train.chunk_gdn_nondet_bwd` (mode ``nondet``): the tensors and
    meta of ``cake_gdn_det_train.GDNDetSavedSet`` (same names, shapes and dtypes; ``plan``
    is the forward's :class:`~cake_gdn_nondet_train.GDNNondetPlan`). A det backward refuses
    it, and this package's backward refuses a det one (``ValueError``)."""

    tensor_names = GDNDetSavedSet.tensor_names
    format_version = GDNDetSavedSet.format_version


class GDNNondetWorkspace(GDNDetWorkspace):
    """Scratch of the forward (and of the backward's recompute) for one
    :class:`~cake_gdn_nondet_train.GDNNondetPlan` (mode ``nondet``): the buffers, sizes and
    reuse rules of ``cake_gdn_det_train.GDNDetWorkspace``. Build with
    ``GDNNondetWorkspace.for_plan(plan, device, *, num_v_heads, max_tokens, max_seqs=1,
    dtype=torch.float32)`` (``ValueError`` for a plan that is not a GDNNondetPlan). Det
    entries refuse it, and this package refuses a det workspace."""

    plan_type: ClassVar[type[GDNNondetPlan]] = GDNNondetPlan


__all__ = ["GDNNondetSavedSet", "GDNNondetWorkspace"]
