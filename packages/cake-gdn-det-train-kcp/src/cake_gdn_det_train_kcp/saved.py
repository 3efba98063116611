"""GDNDetKCPSavedSet and GDNDetKCPWorkspace: this package's own det types (the backward
refuses the single-rank package's types, and any non-det type, by type and mode)."""

from __future__ import annotations

import torch
from cake_core.kcp_state import KCPStateSavedSet, KCPStateWorkspace
from cake_gdn_det_train import GDNDetPlan, GDNDetSavedSet, GDNDetWorkspace, make_plan

__all__ = ["GDNDetKCPSavedSet", "GDNDetKCPWorkspace", "p_plan"]


class GDNDetKCPSavedSet(KCPStateSavedSet):
    """What :func:`~cake_gdn_det_train_kcp.chunk_gdn_det_fwd_kcp` keeps for its backward.

    Own tensors:
        v, g, beta: the rank-local inputs as given (``[1, T_r, ...]``). q and k are not
            kept (their shape and dtype are: ``qk_shape``, ``qk_dtype``): the nested sets
            hold what the backward reads (with the L2 norm, its outputs).
        P: fp32 ``[n_mid, HV, K, K]``, the state transition of each of this rank's middle
            fragments (fragments that both receive and send a state; all-gather exchange
            only), in local order; ``None`` when there is none.
    Nested: ``local``, one :class:`cake_gdn_det_train.GDNDetSavedSet` per single-rank call
    of the forward (a group of this rank's fragments), in ``meta["groups"]`` order.
    :meth:`tensors` lists the own tensors, then each nested set's, so autograd can save all
    of them (:meth:`from_tensors` rebuilds the nesting).

    Meta: ``partition_key``, ``rank``, ``world_size``, ``exchange``, ``num_tokens`` (the
    context the forward ran on: the backward refuses another), ``groups`` (``(kind,
    fragment indices)`` per nested set), ``local_meta`` (their metadata), ``plan`` (the
    local GDNDetPlan), ``scale``, ``use_qk_l2norm``, ``has_middle``, ``qk_shape`` (the
    rank-local q's shape, k's too), ``qk_dtype``.
    """

    tensor_names = ("v", "g", "beta", "P")
    # 2: with the L2 norm q and k are its outputs (the KCP sets: q, k not kept)
    format_version = 2
    local_type = GDNDetSavedSet


def p_plan(plan: GDNDetPlan, dtype: torch.dtype, device: torch.device) -> GDNDetPlan:
    """The plan of the transition run (value width ``K``): ``plan`` itself when it is for
    ``(K, K)``, else ``make_plan(K, K, dtype, device)``."""
    K = plan.head_k_dim
    return plan if plan.head_v_dim == K else make_plan(K, K, dtype, device)


class GDNDetKCPWorkspace(KCPStateWorkspace):
    """Scratch of the KCP forward and backward on one rank, for one plan and context.

    Buffers (fp32, all-gather exchange; empty ``[0, ...]`` without crossing documents or
    with the ring): ``fwd_send`` ``[S_f, HV, K, Wd]`` and ``fwd_recv`` ``[W * S_f, HV, K,
    Wd]``, ``bwd_send`` / ``bwd_recv`` the same with ``S_b``; ``S_f`` / ``S_b`` the
    context's slots per rank, ``Wd = K + V`` when the partition has middle fragments, else
    ``V``. Nested: ``local``, a :class:`cake_gdn_det_train.GDNDetWorkspace` for the plan and
    the rank's tokens and fragments (every single-rank call of the route uses it), and
    ``local_p``, one for the transition run's plan when that differs (``K != V``), else
    ``None``. Contents are overwritten by every call (nothing carries over), so one
    workspace serves every layer that shares the context, plan, ``HV`` and input dtype.
    Build with :meth:`for_context`.
    """

    plan_type = GDNDetPlan
    local_type = GDNDetWorkspace
    transition_plan = staticmethod(p_plan)
