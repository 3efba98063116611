"""KDANondetKCPSavedSet and KDANondetKCPWorkspace: this package's own types, mode
``nondet`` (the KCP backward refuses the single-rank packages' types and any det type, by
type and mode; the det KCP backward refuses these)."""

from __future__ import annotations

import torch
from cake_core.kcp_state import KCPStateSavedSet, KCPStateWorkspace
from cake_kda_det_train_kcp.saved import KDADetKCPSavedSet
from cake_kda_nondet_train import (
    KDANondetPlan,
    KDANondetSavedSet,
    KDANondetWorkspace,
    make_nondet_plan,
)

__all__ = ["KDANondetKCPSavedSet", "KDANondetKCPWorkspace", "p_plan"]


class KDANondetKCPSavedSet(KCPStateSavedSet):
    """What :func:`~cake_kda_nondet_train_kcp.chunk_kda_nondet_fwd_kcp` keeps for its
    backward (mode ``nondet``): the own tensors and meta of cake-kda-det-train-kcp's
    ``KDADetKCPSavedSet`` (its docstring gives them), with nested ``local`` sets of
    ``cake_kda_nondet_train.KDANondetSavedSet`` (one per single-rank call of the forward)
    and ``meta["plan"]`` a ``KDANondetPlan``.
    """

    tensor_names = KDADetKCPSavedSet.tensor_names
    format_version = KDADetKCPSavedSet.format_version
    local_type = KDANondetSavedSet


def p_plan(plan: KDANondetPlan, dtype: torch.dtype, device: torch.device) -> KDANondetPlan:
    """The plan of the transition run (value width ``K``): ``plan`` itself when it is for
    ``(K, K)``, else ``make_nondet_plan(K, K, dtype, device)``."""
    K = plan.head_k_dim
    return plan if plan.head_v_dim == K else make_nondet_plan(K, K, dtype, device)


class KDANondetKCPWorkspace(KCPStateWorkspace):
    """Scratch of the KCP forward and backward on one rank, for one ``KDANondetPlan`` and
    context (mode ``nondet``): the buffers of cake-kda-det-train-kcp's
    ``KDADetKCPWorkspace`` (``fwd_send`` / ``fwd_recv`` / ``bwd_send`` / ``bwd_recv``, fp32),
    with nested ``local`` (and ``local_p`` when K != V) ``KDANondetWorkspace``. Contents are
    overwritten by every call; one workspace serves one call at a time. Build with
    :meth:`for_context`.
    """

    plan_type = KDANondetPlan
    local_type = KDANondetWorkspace
    transition_plan = staticmethod(p_plan)
