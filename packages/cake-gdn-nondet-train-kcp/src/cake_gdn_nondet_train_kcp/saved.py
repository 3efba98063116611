"""GDNNondetKCPSavedSet and GDNNondetKCPWorkspace: this package's own types (mode
``nondet``). The det KCP backward refuses them, and this package's backward refuses the
det KCP package's (and the single-rank packages') types."""

from __future__ import annotations

import torch
from cake_core.kcp_state import KCPStateSavedSet, KCPStateWorkspace
from cake_gdn_det_train_kcp.saved import GDNDetKCPSavedSet
from cake_gdn_nondet_train import (
    GDNNondetPlan,
    GDNNondetSavedSet,
    GDNNondetWorkspace,
    make_nondet_plan,
)

__all__ = ["GDNNondetKCPSavedSet", "GDNNondetKCPWorkspace", "p_nondet_plan"]


class GDNNondetKCPSavedSet(KCPStateSavedSet):
    """What :func:`~cake_gdn_nondet_train_kcp.chunk_gdn_nondet_fwd_kcp` keeps for its
    backward (mode ``nondet``): the own tensors (q, k, v, g, beta, P) and meta of
    ``cake_gdn_det_train_kcp.GDNDetKCPSavedSet``; nested ``local``: one
    :class:`cake_gdn_nondet_train.GDNNondetSavedSet` per single-rank call of the forward;
    ``meta["plan"]`` the forward's :class:`cake_gdn_nondet_train.GDNNondetPlan`."""

    tensor_names = GDNDetKCPSavedSet.tensor_names
    format_version = GDNDetKCPSavedSet.format_version
    local_type = GDNNondetSavedSet


def p_nondet_plan(plan: GDNNondetPlan, dtype: torch.dtype,
                  device: torch.device) -> GDNNondetPlan:
    """The plan of the transition run (value width ``K``): ``plan`` itself when it is for
    ``(K, K)``, else ``make_nondet_plan(K, K, dtype, device)``."""
    K = plan.head_k_dim
    return plan if plan.head_v_dim == K else make_nondet_plan(K, K, dtype, device)


class GDNNondetKCPWorkspace(KCPStateWorkspace):
    """Scratch of the KCP forward and backward on one rank, for one
    :class:`~cake_gdn_nondet_train.GDNNondetPlan` and context (mode ``nondet``): the
    buffers and reuse rules of ``cake_gdn_det_train_kcp.GDNDetKCPWorkspace``, its nested
    ``local`` / ``local_p`` :class:`cake_gdn_nondet_train.GDNNondetWorkspace`. Build with
    ``GDNNondetKCPWorkspace.for_context(plan, ctx, *, num_v_heads, dtype=torch.float32)``.
    """

    plan_type = GDNNondetPlan
    local_type = GDNNondetWorkspace
    transition_plan = staticmethod(p_nondet_plan)
