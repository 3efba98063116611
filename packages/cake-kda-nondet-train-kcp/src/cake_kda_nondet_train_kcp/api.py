"""Context-parallel (KCP) entries of cake-kda-nondet-train's chunked Kimi Delta Attention.

The route, exchange, folds, checks and errors are cake-kda-det-train-kcp's
(``cake_kda_det_train_kcp.api.run_fwd_kcp`` / ``run_bwd_kcp`` / ``run_autograd_kcp`` with
this package's :data:`NONDET_KCP_KINDS`; its module docstring gives the affine summary
``S_end = P S_start + Q`` and the two exchanges): each rank runs cake-kda-nondet-train's
single-rank forward and backward on groups of its fragments. It runs cake-kda-det-train's
kernels today; its bits are not promised. What is its own: the mode ``nondet`` its saved
sets, workspaces and plans carry (the det KCP entries refuse them, these refuse the det
ones) and the deterministic-algorithms alert of its backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_core.kcp import Context
from cake_kda_det_train.api import run_bwd
from cake_kda_det_train_kcp.api import KCPKinds, run_autograd_kcp, run_bwd_kcp, run_fwd_kcp
from cake_kda_nondet_train import KDANondetPlan, chunk_kda_nondet_fwd, make_nondet_plan
from cake_kda_nondet_train.api import NONDET_KINDS

from cake_kda_nondet_train_kcp.saved import KDANondetKCPSavedSet, KDANondetKCPWorkspace, p_plan

__all__ = [
    "KDANondetKCPGrads",
    "chunk_kda_nondet_bwd_kcp",
    "chunk_kda_nondet_fwd_kcp",
    "chunk_kda_nondet_kcp",
]

#: the det entry a user who needs repeatable gradients takes instead
DET_ENTRY = "cake_kda_det_train_kcp.chunk_kda_det_kcp"


class KDANondetKCPGrads(NamedTuple):
    """Gradients of :func:`chunk_kda_nondet_bwd_kcp` (the fields of
    ``cake_kda_det_train_kcp.KDADetKCPGrads``), rank-local, each like its input (shape and
    dtype): ``dq``, ``dk`` ``[1, T_r, H, K]``, ``dv`` ``[1, T_r, HV, V]``, ``dg``
    ``[1, T_r, HV, K]`` (w.r.t. the raw gate with ``use_gate_in_kernel``), ``dbeta``
    ``[1, T_r, HV]`` (w.r.t. the pre-sigmoid beta with ``use_beta_sigmoid_in_kernel``).
    ``dA_log`` ``[HV]`` / ``ddt_bias`` ``[HV * K]`` in A_log's / dt_bias's dtype with
    ``use_gate_in_kernel`` and that parameter, else ``None``: summed over every rank's
    tokens (equal bits on every rank) with ``reduce_gate_param_grads``, else this rank's
    share."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor
    dA_log: torch.Tensor | None = None
    ddt_bias: torch.Tensor | None = None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_kda_nondet_train_kcp's backward", DET_ENTRY)


#: the single-rank kinds of the local backward calls: this package's backward alerts once,
#: before its first launch or collective, so the local calls do not alert again
_LOCAL_KINDS = NONDET_KINDS._replace(before_bwd=None)


def _local_bwd(do, dht, saved, *, plan, workspace):
    """cake-kda-nondet-train's low-level backward, without its own alert."""
    return run_bwd(_LOCAL_KINDS, do, dht, saved, plan, workspace)


#: this package's kinds: nondet plans, KCP saved sets and workspaces, cake-kda-nondet-train's
#: single-rank entries, the alert before any backward launch or collective
NONDET_KCP_KINDS = KCPKinds(
    Mode.NONDET, KDANondetPlan, make_nondet_plan, {}, KDANondetKCPSavedSet,
    KDANondetKCPWorkspace, KDANondetKCPGrads, lambda *a, **kw: chunk_kda_nondet_fwd(*a, **kw),
    _local_bwd, p_plan, _deterministic_alert)


def chunk_kda_nondet_fwd_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, ctx: Context, *,
                             scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
                             use_gate_in_kernel: bool = False,
                             A_log: torch.Tensor | None = None,
                             dt_bias: torch.Tensor | None = None,
                             lower_bound: float | None = None,
                             use_beta_sigmoid_in_kernel: bool = False,
                             allow_neg_eigval: bool = False, safe_gate: bool = False,
                             reduce_gate_param_grads: bool = True,
                             plan: KDANondetPlan | None = None,
                             workspace: KDANondetKCPWorkspace | None = None):
    """Context-parallel chunked Kimi Delta Attention forward on one rank, no autograd, bits
    not promised.

    Arguments, semantics and errors as ``cake_kda_det_train_kcp.chunk_kda_det_fwd_kcp``
    (rank-local ``[1, T_r, ...]`` q, k, v, g, beta; ``ctx`` from
    :func:`build_context_nondet_kcp`; FLA's in-kernel options; every rank calls it), with
    ``plan`` a ``cake_kda_nondet_train.KDANondetPlan`` (default ``make_nondet_plan(K, V,
    q.dtype, device)``) and ``workspace`` a :class:`KDANondetKCPWorkspace`.

    Returns:
        ``(o, saved)``: o ``[1, T_r, HV, V]`` in v's dtype; saved a
        :class:`KDANondetKCPSavedSet` for :func:`chunk_kda_nondet_bwd_kcp`.

    Raises:
        ValueError: every refusal of the det KCP forward, and a plan or workspace of another
            type or mode (a det one too); before any allocation, launch or collective.
    """
    return run_fwd_kcp(NONDET_KCP_KINDS, q, k, v, g, beta, ctx, scale,
                       use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                       lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                       reduce_gate_param_grads, plan, workspace)


def chunk_kda_nondet_bwd_kcp(do: torch.Tensor, saved: KDANondetKCPSavedSet, ctx: Context, *,
                             reduce_gate_param_grads: bool | None = None,
                             plan: KDANondetPlan | None = None,
                             workspace: KDANondetKCPWorkspace | None = None
                             ) -> KDANondetKCPGrads:
    """Backward of :func:`chunk_kda_nondet_fwd_kcp` on one rank (every rank must call it),
    bits not promised; arguments as ``cake_kda_det_train_kcp.chunk_kda_det_bwd_kcp``.

    Returns:
        :class:`KDANondetKCPGrads` ``(dq, dk, dv, dg, dbeta, dA_log, ddt_bias)``.

    Raises:
        ValueError: a saved set or workspace that is not this package's (a det KCP one, a
            single-rank one), a saved set from another context, ``do`` of the wrong shape,
            dtype or device, a foreign plan; before any allocation, launch or collective.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, after those
            checks and before any launch or collective, naming
            ``cake_kda_det_train_kcp.chunk_kda_det_kcp`` (``warn_only=True``: one warning
            per process, then it runs).
    """
    return run_bwd_kcp(NONDET_KCP_KINDS, do, saved, ctx, reduce_gate_param_grads, plan,
                       workspace)


@torch.compiler.disable
def chunk_kda_nondet_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                         use_qk_l2norm_in_kernel: bool = False,
                         use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                         dt_bias: torch.Tensor | None = None,
                         lower_bound: float | None = None,
                         use_beta_sigmoid_in_kernel: bool = False,
                         allow_neg_eigval: bool = False, safe_gate: bool = False,
                         reduce_gate_param_grads: bool = True,
                         plan: KDANondetPlan | None = None,
                         workspace: KDANondetKCPWorkspace | None = None) -> torch.Tensor:
    """Context-parallel chunked Kimi Delta Attention with autograd, bits not promised;
    returns the rank-local ``o`` ``[1, T_r, HV, V]``.

    Arguments, semantics and errors as :func:`chunk_kda_nondet_fwd_kcp`; gradients flow to
    q, k, v, g, beta and, with the in-kernel gate, A_log and dt_bias. Every rank must run
    the forward and the backward (collectives inside). Not twice differentiable;
    ``torch.compile`` does not trace it (a graph break). The backward raises
    ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)`` before any launch
    or collective, naming ``cake_kda_det_train_kcp.chunk_kda_det_kcp`` (``warn_only=True``:
    one warning per process, then it runs); it never falls back to the det package.
    """
    return run_autograd_kcp(NONDET_KCP_KINDS, q, k, v, g, beta, ctx, scale,
                            use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                            lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                            safe_gate, reduce_gate_param_grads, plan, workspace)
