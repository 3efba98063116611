"""Context-parallel (KCP) entries of the non-deterministic chunked Gated DeltaNet.

The route is cake-gdn-det-train-kcp's (``cake_gdn_det_train_kcp.api``: fragment groups,
the all-gather of fp32 affine summaries or the ring of exact states, the fixed-order
folds; ``docs/kcp.md``), run with this package's types (:data:`NONDET`) and, on each rank,
cake-gdn-nondet-train's single-rank entries. Its bits are not promised. Under
``torch.use_deterministic_algorithms(True)`` the backward raises ``RuntimeError`` before
any launch or collective (with ``warn_only=True`` it warns once and runs); use
``cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp`` for repeatable gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_core.kcp import Context
from cake_gdn_det_train.api import bwd_entry
from cake_gdn_det_train_kcp.api import (
    KCPModeTypes,
    autograd_kcp_entry,
    bwd_kcp_entry,
    fwd_kcp_entry,
)
from cake_gdn_nondet_train import GDNNondetPlan, chunk_gdn_nondet_fwd, make_nondet_plan
from cake_gdn_nondet_train.api import NONDET as _LOCAL

from cake_gdn_nondet_train_kcp.saved import GDNNondetKCPSavedSet, GDNNondetKCPWorkspace

__all__ = [
    "GDNNondetKCPGrads",
    "chunk_gated_delta_rule_nondet_kcp",
    "chunk_gdn_nondet_bwd_kcp",
    "chunk_gdn_nondet_fwd_kcp",
]

#: the det entry named by the deterministic-algorithms alert
DET_ENTRY = "cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp"


class GDNNondetKCPGrads(NamedTuple):
    """Gradients of :func:`chunk_gdn_nondet_bwd_kcp`, rank-local, each like its input
    (shape and dtype): ``dq``, ``dk`` ``[1, T_r, H, K]``, ``dv`` ``[1, T_r, HV, V]``,
    ``dg``, ``dbeta`` ``[1, T_r, HV]``."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor


def _alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_gdn_nondet_train_kcp's backward", DET_ENTRY)


#: the single-rank nondet types without their own alert: the route alerts once, first
_LOCAL_QUIET = _LOCAL._replace(before_bwd=None)


def _local_bwd(do, dht, saved, *, plan=None, workspace=None):
    """cake-gdn-nondet-train's backward (every check, then the launches) without its
    alert."""
    return bwd_entry(_LOCAL_QUIET, do, dht, saved, plan, workspace)


#: this package's types: nondet plans, its KCP saved set and workspace, cake-gdn-nondet-
#: train's single-rank entries
NONDET = KCPModeTypes(Mode.NONDET, GDNNondetPlan, GDNNondetKCPSavedSet, GDNNondetKCPWorkspace,
                      make_nondet_plan, {}, chunk_gdn_nondet_fwd, _local_bwd,
                      GDNNondetKCPGrads, _alert)


def chunk_gdn_nondet_fwd_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, ctx: Context, *,
                             scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
                             plan: GDNNondetPlan | None = None,
                             workspace: GDNNondetKCPWorkspace | None = None):
    """Context-parallel non-deterministic chunked Gated DeltaNet forward on one rank,
    without autograd.

    Arguments, semantics, shapes and errors as
    ``cake_gdn_det_train_kcp.chunk_gdn_det_fwd_kcp`` (rank-local ``[1, T_r, ...]``
    tensors, every rank of ``ctx.group`` calls it; no initial / final state), with ``ctx``
    from :func:`~cake_gdn_nondet_train_kcp.build_context_nondet_kcp`, ``plan`` a
    ``cake_gdn_nondet_train.GDNNondetPlan`` (default ``make_nondet_plan(K, V, q.dtype,
    device)``) and ``workspace`` a :class:`GDNNondetKCPWorkspace` from
    ``for_context(plan, ctx, ...)``.

    Returns:
        ``(o, saved)``: o ``[1, T_r, HV, V]`` in v's dtype; saved a
        :class:`GDNNondetKCPSavedSet` for :func:`chunk_gdn_nondet_bwd_kcp`.

    Raises:
        ValueError: as the det entry, and for a det plan or workspace (or any of another
            type or mode); before any allocation, launch or collective.
    """
    return fwd_kcp_entry(NONDET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                         workspace)


def chunk_gdn_nondet_bwd_kcp(do: torch.Tensor, saved: GDNNondetKCPSavedSet, ctx: Context, *,
                             plan: GDNNondetPlan | None = None,
                             workspace: GDNNondetKCPWorkspace | None = None
                             ) -> GDNNondetKCPGrads:
    """Backward of :func:`chunk_gdn_nondet_fwd_kcp` on one rank (every rank must call it):
    as ``cake_gdn_det_train_kcp.chunk_gdn_det_bwd_kcp``.

    Returns:
        :class:`GDNNondetKCPGrads` ``(dq, dk, dv, dg, dbeta)``, rank-local, like the inputs.

    Raises:
        ValueError: a saved set or workspace that is not this package's nondet type (a det
            one, the single-rank package's), a saved set from another context, ``do`` of the
            wrong shape, dtype or device, a foreign plan; before any launch or collective.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)`` (after the checks,
            before any launch or collective), naming
            ``cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp``; with
            ``warn_only=True`` a warning (once per process) and the backward runs.
    """
    return bwd_kcp_entry(NONDET, do, saved, ctx, plan, workspace)


@torch.compiler.disable
def chunk_gated_delta_rule_nondet_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                      g: torch.Tensor, beta: torch.Tensor, ctx: Context, *,
                                      scale: float | None = None,
                                      use_qk_l2norm_in_kernel: bool = False,
                                      plan: GDNNondetPlan | None = None,
                                      workspace: GDNNondetKCPWorkspace | None = None
                                      ) -> torch.Tensor:
    """Context-parallel non-deterministic chunked Gated DeltaNet with autograd; returns
    rank-local ``o``. Arguments and errors as :func:`chunk_gdn_nondet_fwd_kcp`; gradients
    flow to q, k, v, g and beta (the backward alerts as :func:`chunk_gdn_nondet_bwd_kcp`).
    Every rank must run the forward and the backward. Not twice differentiable; a graph
    break under ``torch.compile``.
    """
    return autograd_kcp_entry(NONDET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                              plan, workspace)
