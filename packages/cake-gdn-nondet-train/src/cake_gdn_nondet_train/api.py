"""Autograd entry and low-level forward / backward of the non-deterministic chunked Gated
DeltaNet.

The math is cake-gdn-det-train's (:mod:`cake_gdn_det_train.reference`), and so today are
the kernels and their launches: the entries here run ``cake_gdn_det_train.api``'s checks
and launches with this package's types (:data:`NONDET`: :class:`GDNNondetPlan`,
:class:`GDNNondetSavedSet`, :class:`GDNNondetWorkspace`, mode ``nondet``) and this
package's custom ops ``cake_gdn_nondet_train::fwd`` / ``::bwd``. Nothing promises their
bits. Under ``torch.use_deterministic_algorithms(True)`` the backward raises
``RuntimeError`` before any launch (with ``warn_only=True`` it warns once and runs); use
``cake_gdn_det_train.chunk_gated_delta_rule_det`` for repeatable gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_gdn_det_train.api import ModeTypes, autograd_entry, bwd_entry, define_ops, fwd_entry

from cake_gdn_nondet_train.plan import GDNNondetPlan, make_nondet_plan
from cake_gdn_nondet_train.saved import GDNNondetSavedSet, GDNNondetWorkspace

__all__ = ["GDNNondetGrads", "chunk_gated_delta_rule_nondet", "chunk_gdn_nondet_bwd",
           "chunk_gdn_nondet_fwd"]

#: the det entry named by the deterministic-algorithms alert
DET_ENTRY = "cake_gdn_det_train.chunk_gated_delta_rule_det"


def _alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_gdn_nondet_train's backward", DET_ENTRY)


#: this package's types: nondet plans, saved sets and workspaces, its own custom ops
NONDET = ModeTypes(Mode.NONDET, GDNNondetPlan, GDNNondetSavedSet, GDNNondetWorkspace,
                   make_nondet_plan, "cake_gdn_nondet_train", {}, {}, _alert)

_fwd_op, _bwd_op = define_ops(NONDET)


class GDNNondetGrads(NamedTuple):
    """Gradients of :func:`chunk_gdn_nondet_bwd`, as ``cake_gdn_det_train.GDNDetGrads``.

    dq, dk: like q and k. dv: like v. dg, dbeta: like g and beta (their dtypes), w.r.t. the
    g and beta given (the raw gate / pre-sigmoid beta with the in-kernel options).
    dinitial_state: fp32 ``[N, HV, K, V]`` when the forward had an initial state, else
    ``None``. dA_log, ddt_bias: ``[HV]`` in A_log's / dt_bias's dtype with
    ``use_gate_in_kernel`` (ddt_bias only with a dt_bias), else ``None``.
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor
    dinitial_state: torch.Tensor | None
    dA_log: torch.Tensor | None = None
    ddt_bias: torch.Tensor | None = None


def chunk_gdn_nondet_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None,
                         initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False,
                         use_qk_l2norm_in_kernel: bool = False,
                         cu_seqlens: torch.Tensor | None = None, *,
                         plan: GDNNondetPlan | None = None,
                         workspace: GDNNondetWorkspace | None = None,
                         use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                         dt_bias: torch.Tensor | None = None,
                         use_beta_sigmoid_in_kernel: bool = False,
                         allow_neg_eigval: bool = False):
    """Non-deterministic chunked Gated DeltaNet forward, without autograd.

    Arguments, shapes, dtypes, numerics and errors as ``cake_gdn_det_train.chunk_gdn_det_fwd``
    (FLA's ``chunk_gated_delta_rule`` semantics, forward only), with this package's types:
    ``plan`` a :class:`GDNNondetPlan` (default ``make_nondet_plan(K, V, q.dtype, device)``),
    ``workspace`` a :class:`GDNNondetWorkspace` for it (default: scratch per call).

    Returns:
        ``(o, final_state, saved)``: o ``[B, T, HV, V]`` in q's dtype; final_state fp32
        ``[N, HV, K, V]`` or ``None``; saved a :class:`GDNNondetSavedSet` for
        :func:`chunk_gdn_nondet_bwd`.

    Raises:
        ValueError: as the det entry, and for a det plan or workspace (or any of another
            type or mode); before any allocation or launch. Inputs are never modified.
    """
    return fwd_entry(NONDET, q, k, v, g, beta, scale, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel, cu_seqlens, plan, workspace, use_gate_in_kernel,
                     A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval)


def chunk_gdn_nondet_bwd(do: torch.Tensor, dht: torch.Tensor | None,
                         saved: GDNNondetSavedSet, *, plan: GDNNondetPlan | None = None,
                         workspace: GDNNondetWorkspace | None = None) -> GDNNondetGrads:
    """Low-level backward of :func:`chunk_gdn_nondet_fwd`.

    Arguments as ``cake_gdn_det_train.chunk_gdn_det_bwd``: ``do`` like o, ``dht`` fp32
    ``[N, HV, K, V]`` or ``None``, ``saved`` the forward's :class:`GDNNondetSavedSet`,
    ``plan`` (default: the forward's) and ``workspace`` of this package.

    Returns:
        :class:`GDNNondetGrads` ``(dq, dk, dv, dg, dbeta, dinitial_state, dA_log,
        ddt_bias)``.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (a det one),
            ``do`` / ``dht`` of the wrong shape, dtype or device; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)`` (after the
            checks, before any launch), naming
            ``cake_gdn_det_train.chunk_gated_delta_rule_det``; with ``warn_only=True`` a
            warning (once per process) and the backward runs.
    """
    return GDNNondetGrads(*bwd_entry(NONDET, do, dht, saved, plan, workspace))


def chunk_gated_delta_rule_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  g: torch.Tensor, beta: torch.Tensor,
                                  scale: float | None = None,
                                  initial_state: torch.Tensor | None = None,
                                  output_final_state: bool = False,
                                  use_qk_l2norm_in_kernel: bool = False,
                                  cu_seqlens: torch.Tensor | None = None, *,
                                  plan: GDNNondetPlan | None = None,
                                  use_gate_in_kernel: bool = False,
                                  A_log: torch.Tensor | None = None,
                                  dt_bias: torch.Tensor | None = None,
                                  use_beta_sigmoid_in_kernel: bool = False,
                                  allow_neg_eigval: bool = False, **fla_kwargs):
    """Non-deterministic drop-in for FLA's ``chunk_gated_delta_rule``, with autograd.

    Arguments, FLA keywords (``cu_seqlens_cpu``, ``chunk_indices``, ``disable_recompute``,
    ``chunk_size=64``, ``state_v_first``, ``transpose_state_layout``, ``head_first``,
    ``cp_context``), shapes and errors as ``cake_gdn_det_train.chunk_gated_delta_rule_det``,
    with ``plan`` a :class:`GDNNondetPlan` (``disable_recompute=True``: the plan it picks
    with ``keep_states = 1``, or the ``plan`` given, which must have ``keep_states = 1``).
    Returns ``(o, final_state)`` (``final_state`` ``None`` without ``output_final_state``);
    gradients flow to q, k, v, g, beta, initial_state, A_log and dt_bias; not twice
    differentiable. Eager and under ``torch.compile`` the call is the custom ops
    ``cake_gdn_nondet_train::fwd`` / ``::bwd``.

    Raises:
        ValueError: as the det entry, and for a det plan.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch, naming ``cake_gdn_det_train.chunk_gated_delta_rule_det``
            (``warn_only=True``: a warning once per process, then it runs).
    """
    return autograd_entry(NONDET, "chunk_gated_delta_rule_nondet", q, k, v, g, beta, scale,
                          initial_state, output_final_state, use_qk_l2norm_in_kernel,
                          cu_seqlens, plan, use_gate_in_kernel, A_log, dt_bias,
                          use_beta_sigmoid_in_kernel, allow_neg_eigval, fla_kwargs)
