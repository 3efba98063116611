"""Autograd entry and low-level forward/backward of cake-kda-nondet-train.

The math, arguments, shapes, dtypes and errors are cake-kda-det-train's (FLA's
``chunk_kda``; Kimi Team, 2025, "Kimi Linear", arXiv:2510.26692): per sequence and value
head, state S ``[K, V]`` in fp32, per-channel log decay g_t ``[K]``, for each token

    S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;
    o_t = scale S^T q_t

The checks and launches are cake-kda-det-train's (``cake_kda_det_train.api.run_fwd`` /
``run_bwd`` / ``run_autograd`` with this package's :data:`NONDET_KINDS`): this package
runs its kernels today, at its speed, and promises no bits. What is its own: the mode
``nondet`` its plans, saved sets and workspaces carry (the det entries refuse them, these
entries refuse the det ones), its custom ops ``cake_kda_nondet_train::fwd`` / ``::bwd``,
and the deterministic-algorithms alert of its backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_kda_det_train.api import ModeKinds, register_ops, run_autograd, run_bwd, run_fwd

from cake_kda_nondet_train.plan import KDANondetPlan, make_nondet_plan
from cake_kda_nondet_train.saved import KDANondetSavedSet, KDANondetWorkspace

#: the det entry a user who needs repeatable gradients takes instead
DET_ENTRY = "cake_kda_det_train.chunk_kda_det"


class KDANondetGrads(NamedTuple):
    """Gradients of :func:`chunk_kda_nondet_bwd` (the fields of
    ``cake_kda_det_train.KDADetGrads``).

    dq, dk: like q and k (``[B, T, H, K]``, their dtype). dv: like v. dg: like g
    (``[B, T, HV, K]``, g's dtype), dbeta: like beta (``[B, T, HV]``), both w.r.t. the g and
    beta given (the raw gate / pre-sigmoid beta with the in-kernel options).
    dinitial_state: fp32 ``[N, HV, K, V]`` when the forward had an initial state, else
    ``None``. dA_log: ``[HV]`` in A_log's dtype with ``use_gate_in_kernel`` and an A_log,
    else ``None``. ddt_bias: ``[HV * K]`` in dt_bias's dtype with ``use_gate_in_kernel`` and
    a dt_bias, else ``None``.
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor
    dinitial_state: torch.Tensor | None
    dA_log: torch.Tensor | None = None
    ddt_bias: torch.Tensor | None = None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_kda_nondet_train's backward", DET_ENTRY)


_DEFAULT_PLANS: dict[tuple, KDANondetPlan] = {}
_KEPT_PLANS: dict[tuple, KDANondetPlan] = {}

#: this package's kinds: nondet plans, saved sets and workspaces, ops
#: ``cake_kda_nondet_train::``, the alert before any backward launch
NONDET_KINDS = ModeKinds(Mode.NONDET, KDANondetPlan, KDANondetSavedSet, KDANondetWorkspace,
                         KDANondetGrads, make_nondet_plan, _DEFAULT_PLANS, _KEPT_PLANS,
                         "cake_kda_nondet_train", "chunk_kda_nondet", _deterministic_alert)

_fwd_op, _bwd_op = register_ops(NONDET_KINDS)


def chunk_kda_nondet_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None,
                         initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False,
                         use_qk_l2norm_in_kernel: bool = False,
                         cu_seqlens: torch.Tensor | None = None, *,
                         use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                         dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                         use_beta_sigmoid_in_kernel: bool = False,
                         allow_neg_eigval: bool = False, safe_gate: bool = False,
                         plan: KDANondetPlan | None = None,
                         workspace: KDANondetWorkspace | None = None):
    """Chunked Kimi Delta Attention forward, without autograd, bits not promised.

    Arguments, shapes, dtypes, semantics and errors as ``cake_kda_det_train.
    chunk_kda_det_fwd`` (FLA's ``chunk_kda``: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g
    ``[B, T, HV, K]``; beta ``[B, T, HV]``; fp32 / bf16 / fp16; initial_state fp32
    ``[N, HV, K, V]``; ``cu_seqlens`` with B = 1; the in-kernel L2 norm, gate and beta
    sigmoid), except: ``plan`` is a
    :class:`~cake_kda_nondet_train.KDANondetPlan` (default ``make_nondet_plan(K, V,
    q.dtype, device)``) and ``workspace`` a :class:`~cake_kda_nondet_train.
    KDANondetWorkspace`.

    Returns:
        ``(o, final_state, saved)``: o ``[B, T, HV, V]`` in v's dtype; final_state fp32
        ``[N, HV, K, V]`` or ``None``; saved a :class:`~cake_kda_nondet_train.
        KDANondetSavedSet` for :func:`chunk_kda_nondet_bwd`.

    Raises:
        ValueError: every refusal of the det forward, and a plan or workspace of another
            type or mode (a det one too); before any allocation or launch. Inputs are never
            modified.
    """
    return run_fwd(NONDET_KINDS, q, k, v, g, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias,
                   lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                   workspace)


def chunk_kda_nondet_bwd(do: torch.Tensor, dht: torch.Tensor | None,
                         saved: KDANondetSavedSet, *, plan: KDANondetPlan | None = None,
                         workspace: KDANondetWorkspace | None = None) -> KDANondetGrads:
    """Low-level backward of :func:`chunk_kda_nondet_fwd`, bits not promised.

    Args:
        do: gradient of o, ``[B, T, HV, V]``, fp32/bf16/fp16.
        dht: gradient of final_state, fp32 ``[N, HV, K, V]``, or ``None`` (zero).
        saved: the :class:`~cake_kda_nondet_train.KDANondetSavedSet` of the forward.
        plan: default the forward's (another one must be a KDANondetPlan for the same K and
            V). workspace: as in :func:`chunk_kda_nondet_fwd`.

    Returns:
        :class:`KDANondetGrads` ``(dq, dk, dv, dg, dbeta, dinitial_state, dA_log,
        ddt_bias)``; with the in-kernel gate / beta sigmoid, dg and dbeta are w.r.t. the raw
        g and the pre-sigmoid beta (FLA's derivatives).

    Raises:
        ValueError: a saved set of another type or mode (a det one too), ``do`` / ``dht`` of
            the wrong shape, dtype or device, a plan or workspace of another type, mode or
            plan; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, after those checks
            and before any launch, naming ``cake_kda_det_train.chunk_kda_det`` (with
            ``warn_only=True``: one warning per process, then it runs).
    """
    return run_bwd(NONDET_KINDS, do, dht, saved, plan, workspace)


def chunk_kda_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, scale: float | None = None,
                     initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                     cu_seqlens: torch.Tensor | None = None, *,
                     use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                     dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                     use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                     safe_gate: bool = False, plan: KDANondetPlan | None = None,
                     workspace: KDANondetWorkspace | None = None, **fla_kwargs):
    """Drop-in for FLA's ``chunk_kda`` (Kimi Delta Attention), with autograd, bits not
    promised.

    Arguments, semantics and errors as ``cake_kda_det_train.chunk_kda_det`` (FLA's names;
    everything after ``cu_seqlens`` by keyword; FLA's other keywords accepted as there),
    with a :class:`~cake_kda_nondet_train.KDANondetPlan` / :class:`~cake_kda_nondet_train.
    KDANondetWorkspace`. As there and as FLA, a bf16 / fp16 ``initial_state`` is taken
    (upcast to an fp32 copy first, the caller's tensor unchanged; its gradient comes back
    in its dtype). Returns ``(o, final_state)`` (``final_state`` ``None`` without
    ``output_final_state``); gradients flow to q, k, v, g, beta, initial_state, A_log and
    dt_bias; not twice differentiable. Eager and under ``torch.compile`` (``fullgraph=True``
    works) the call is the custom ops ``cake_kda_nondet_train::fwd`` / ``::bwd``. The
    backward raises ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)``
    before any launch, naming ``cake_kda_det_train.chunk_kda_det`` (``warn_only=True``: one
    warning per process, then it runs); it never falls back to the det package.
    """
    return run_autograd(NONDET_KINDS, q, k, v, g, beta, scale, initial_state,
                        output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                        use_gate_in_kernel, A_log, dt_bias, lower_bound,
                        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                        workspace, fla_kwargs)


__all__ = ["KDANondetGrads", "chunk_kda_nondet", "chunk_kda_nondet_bwd",
           "chunk_kda_nondet_fwd"]
