"""Autograd entry and low-level forward/backward of the det chunked Kimi Delta Attention.

Math (FLA's ``chunk_kda``; Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient
Attention Architecture", arXiv:2510.26692): per sequence and value head, state S ``[K, V]``
in fp32, per-channel log decay g_t ``[K]``, for each token

    S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;
    o_t = scale S^T q_t

computed on 64-token chunks by :mod:`cake_kda_det_train.chunk`. Around it, this module
runs FLA's in-kernel options: the q/k L2 norm (:mod:`cake_core.l2norm`), the gate from the
raw g (its forward and backward inside the chunk kernels that form G and dg, with dA_log /
ddt_bias summed in a fixed two-stage order: kernels/gate.py) and the beta sigmoid, and
checks every argument before any allocation or launch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import Mode, require_mode
from cake_core.autograd import once_differentiable
from cake_core.compile import (
    eager_function,
    optional_output,
    plan_from_op_fields,
    plan_to_op_fields,
)
from cake_core.gemm import ordered_sum
from cake_core.l2norm import l2norm_fwd
from cake_core.linear_attention import (
    autograd_cu_seqlens,
    beta_code,
    check_cu_seqlens_position,
    check_device_and_state,
    check_fla_compat,
    check_gate_params,
    check_grad_outputs,
    check_options,
    check_qkv_g_beta,
    disable_recompute_plan,
    resolve_for_backward,
    resolve_plan,
    resolve_scale,
    resolve_workspace,
    saved_chunks,
    saved_meta,
)
from cake_core.triton_utils import cdiv
from cake_core.varlen import SeqChunks, max_chunks, resolve_chunks

from cake_kda_det_train.chunk import kda_chunk_bwd, kda_chunk_fwd, kept_a_shape
from cake_kda_det_train.kernels.gate import (
    kda_beta_bwd_kernel,
    kda_beta_fwd_kernel,
)
from cake_kda_det_train.plan import (
    CHUNK_SIZE,
    MAX_HEAD_DIM,
    KDADetPlan,
    cuda_plan_problem,
    inter_dtype,
    make_plan,
)
from cake_kda_det_train.saved import KDADetSavedSet, KDADetWorkspace, workspace_shapes

#: FLA's safe range of ``lower_bound`` with ``safe_gate`` and the in-kernel gate.
SAFE_GATE_RANGE = (-5.0, 0.0)


class KDADetGrads(NamedTuple):
    """Gradients of :func:`chunk_kda_det_bwd`.

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


class ModeKinds(NamedTuple):
    """What makes a package's entries det or nondet over these same checks and launches
    (this package's :data:`DET_KINDS`; cake-kda-nondet-train builds its own): the mode its
    plans, saved sets and workspaces carry, their classes (an entry refuses any other type
    or mode), its gradients tuple, its plan rule, default-plan cache and the cache of those
    plans' ``keep_states = 1`` copies (FLA's ``disable_recompute=True``), the namespace of
    its custom ops, its autograd entry's name (in messages) and what its backward runs
    before any launch (``None``: nothing; nondet: the deterministic-algorithms alert)."""

    mode: Mode
    plan_type: type
    saved_type: type
    workspace_type: type
    grads_type: type
    make_plan: Callable
    plan_cache: dict
    kept_plan_cache: dict
    namespace: str
    entry: str
    before_bwd: Callable[[], None] | None = None


# ----------------------------------------------------------------------------- checks


def _check_lower_bound(lower_bound: object) -> float | None:
    if lower_bound is None:
        return None
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, numbers.Real) or \
            not math.isfinite(lower_bound) or lower_bound >= 0:
        raise ValueError(f"lower_bound: expected None or a finite number < 0, got "
                         f"{lower_bound!r}")
    return float(lower_bound)


def _check_inputs(q, k, v, g, beta, scale, initial_state, output_final_state,
                  use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel=False, A_log=None,
                  dt_bias=None, lower_bound=None, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False, safe_gate=False, plan=None, kinds=None,
                  disable_recompute: bool = False):
    """All checks of :func:`chunk_kda_det_fwd`, then the plan (of ``kinds``, default
    :data:`DET_KINDS`; one that keeps the chunk states with ``disable_recompute``:
    :func:`_resolve_plan`); returns ``(device, N, scale, A_log, dt_bias, lower_bound, beta
    code, plan, seqs)`` with the gate parameters set to ``None`` where FLA ignores them
    (without ``use_gate_in_kernel``). Reads nothing but shapes, dtypes and devices, except
    the values of ``cu_seqlens`` (one host sync per tensor version; skipped while
    torch.compile traces). seqs: the call's sequences and chunk tables, resolved once
    (:class:`cake_core.varlen.SeqChunks`, read-only; ``None`` while torch.compile
    traces)."""
    check_cu_seqlens_position(cu_seqlens)  # before the shape checks: the FLA hint
    B, T, H, K, HV, V = check_qkv_g_beta(q, k, v, g, beta, max_head_dim=MAX_HEAD_DIM,
                                         per_channel_decay=True)
    scale = resolve_scale(scale, K)
    check_options(output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                  use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate=safe_gate)
    lower_bound = _check_lower_bound(lower_bound)
    if use_gate_in_kernel:
        if safe_gate:
            lo, hi = SAFE_GATE_RANGE
            if lower_bound is None or not lo <= lower_bound < hi:
                raise ValueError(f"lower_bound: safe_gate=True with use_gate_in_kernel=True "
                                 f"needs lower_bound in [{lo:g}, {hi:g}) (FLA's rule), got "
                                 f"{lower_bound!r}")
        if A_log is None and lower_bound is None:
            raise ValueError("A_log: required with use_gate_in_kernel=True unless lower_bound "
                             "is given (the gate is -exp(A_log) * softplus(g + dt_bias))")
        check_gate_params(q.dtype, (A_log, "A_log", [HV]), (dt_bias, "dt_bias", [HV * K]))
    else:
        A_log = dt_bias = lower_bound = None
    device, N, seqs = check_device_and_state(q, k, v, g, beta, initial_state, cu_seqlens,
                                             A_log, dt_bias, chunk_size=CHUNK_SIZE)
    sig = beta_code(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return (device, N, scale, A_log, dt_bias, lower_bound, sig,
            _resolve_plan(plan, K, V, q.dtype, device, kinds, disable_recompute), seqs)


_DEFAULT_PLANS: dict[tuple, KDADetPlan] = {}
_KEPT_PLANS: dict[tuple, KDADetPlan] = {}

#: this package's kinds: det plans, saved sets and workspaces, ops ``cake_kda_det_train::``
DET_KINDS = ModeKinds(Mode.DET, KDADetPlan, KDADetSavedSet, KDADetWorkspace, KDADetGrads,
                      make_plan, _DEFAULT_PLANS, _KEPT_PLANS, "cake_kda_det_train",
                      "chunk_kda_det")


def _resolve_plan(plan, K: int, V: int, dtype: torch.dtype, device: torch.device,
                  kinds: ModeKinds | None = None,
                  disable_recompute: bool = False) -> KDADetPlan:
    """The call's plan: the caller's (checked: ``kinds.plan_type`` of ``kinds.mode``,
    default :data:`DET_KINDS`), else the rule's for (K, V, dtype, device). With
    ``disable_recompute`` (FLA's keyword): the rule's plan with ``keep_states = 1`` (one
    object per plan, kept in ``kinds.kept_plan_cache``), or the caller's when it keeps the
    states (:func:`cake_core.linear_attention.disable_recompute_plan`: ``ValueError`` for
    a caller's plan with ``keep_states = 0``)."""
    kinds = kinds or DET_KINDS
    got = resolve_plan(plan, K, V, dtype, device, plan_type=kinds.plan_type,
                       make_plan=kinds.make_plan, cuda_plan_problem=cuda_plan_problem,
                       cache=kinds.plan_cache, mode=kinds.mode)
    if disable_recompute:
        got = disable_recompute_plan(got, plan, kinds.kept_plan_cache)
    return got


def _resolve_workspace(workspace, plan: KDADetPlan, device: torch.device, HV: int, NT: int,
                       NC: int, dtype: torch.dtype, kinds: ModeKinds | None = None):
    """``None``, or the caller's workspace after every check (type and mode of ``kinds``,
    plan, device, buffer dtype/shape/contiguity, capacity for NT tokens and NC chunks)."""
    kinds = kinds or DET_KINDS
    return resolve_workspace(workspace, plan, device, workspace_type=kinds.workspace_type,
                             buffer_shapes=workspace_shapes(plan, HV),
                             buffer_dtype=inter_dtype(plan, dtype), tokens=NT, chunks=NC,
                             mode=kinds.mode)


# ----------------------------------------------------------------------------- launches


def _l2norm(x: torch.Tensor, plan: KDADetPlan):
    return l2norm_fwd(x, block_rows=plan.l2norm_block_rows, block_k=plan.block_k,
                      num_warps=4)


def _beta_fwd(beta, use_sigmoid: int, plan: KDADetPlan):
    """The beta the chunk computation uses: fp32 ``use_sigmoid * sigmoid(beta)`` ``[B, T,
    HV]`` from the pre-sigmoid beta where the options say so, else beta itself. Input
    contiguous. (The in-kernel gate is applied by :func:`kda_chunk_fwd`.)"""
    if not use_sigmoid:
        return beta
    B, T, HV = beta.shape
    NT = B * T
    b_out = torch.empty(beta.shape, dtype=torch.float32, device=beta.device)
    if NT:
        kda_beta_fwd_kernel[(cdiv(NT, plan.gate_block_t), HV)](
            beta, b_out, NT, HV, BETA_SIGMOID=use_sigmoid, BLOCK_T=plan.gate_block_t,
            num_warps=4)
    return b_out


def _beta_bwd(beta, dbeta, use_sigmoid: int, plan: KDADetPlan):
    """In place: dbeta (fp32 ``[NT, HV]``), w.r.t. beta', becomes the gradient w.r.t. the
    pre-sigmoid beta where the options say so."""
    if not use_sigmoid:
        return
    NT, HV = dbeta.shape
    if NT:
        kda_beta_bwd_kernel[(cdiv(NT, plan.gate_block_t), HV)](
            beta, dbeta, NT, HV, BETA_SIGMOID=use_sigmoid, BLOCK_T=plan.gate_block_t,
            num_warps=4)


def _gate_param_grads(parts, A_log, dt_bias, HV: int, K: int, device):
    """``(dA_log, ddt_bias)`` (``None`` where not given) from the chunk backward's per-chunk
    fp32 partials: added in chunk order (ordered_sum; no atomics), cast once to A_log's /
    dt_bias's dtype. With no chunks they are zero."""
    f32 = torch.float32
    out = []
    for t, p, n in ((A_log, parts[0], HV), (dt_bias, parts[1], HV * K)):
        if t is None:
            out.append(None)
            continue
        p = p if p is not None else torch.empty((0, n), dtype=f32, device=device)
        out.append(ordered_sum(p, out=torch.empty((n,), dtype=f32, device=device)).to(t.dtype))
    return tuple(out)


def _launch_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, use_l2, tabs,
                plan: KDADetPlan, workspace, gate=(False, None, None, None, 0),
                h_rows: int | None = None):
    """Normalises, gates, runs the chunk forward; inputs contiguous. ``tabs``: the device
    chunk tables (:attr:`cake_core.varlen.SeqChunks.tables`). ``gate``:
    ``(use_gate_in_kernel, A_log, dt_bias, lower_bound, beta code)``, tensors contiguous.
    Returns ``(o, final_state, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states))``; ``qn``,
    ``kn``: q and k L2-normalised (the backward keeps them: the norm's backward needs only
    its outputs), None without the norm (one tensor when q is k); ``states``: the kept
    ``(h, w, kg, v_new)`` with ``plan.keep_states`` and a token, else None (h with
    ``h_rows`` rows when given)."""
    q_rstd = k_rstd = qn = kn = None
    if use_l2:
        qn, q_rstd = _l2norm(q, plan)
        kn, k_rstd = (qn, q_rstd) if k is q else _l2norm(k, plan)
        q, k = qn, kn
    use_gate, A_log, dt_bias, lower_bound, use_sigmoid = gate
    beta = _beta_fwd(beta, use_sigmoid, plan)  # the gate: in kda_chunk_fwd's G kernel
    o, ht, g_cumsum, A, states = kda_chunk_fwd(
        q, k, v, g, beta, scale, initial_state, output_final_state, tabs, plan, workspace,
        gate=(A_log, dt_bias, lower_bound) if use_gate else None, h_rows=h_rows)
    return o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states)


def _kept_states(saved: KDADetSavedSet, plan: KDADetPlan, NT: int, NC: int, HV: int, K: int,
                 V: int, idt: torch.dtype, dev: torch.device):
    """``(h, w, kg, v_new)`` the forward kept (``plan.keep_states``), contiguous, when all
    are there with this call's shapes, dtypes and device and the backward's plan is the
    forward's (the kept bits are those its recompute would give); else ``None``. h may
    have more than NC rows (the custom op's; the first NC are the states). A backward
    plan that differs from the forward's only in ``keep_states`` uses them."""
    fwd_plan = saved.meta.get("plan")
    # a backward plan that differs only in keep_states launches the same kernels
    if saved.h is None or fwd_plan is None or saved.h.shape[0] < NC or \
            dataclasses.replace(plan, keep_states=fwd_plan.keep_states) != fwd_plan:
        return None
    want = ((saved.h[:NC], (NC, HV, K, V)), (saved.w, (NT, HV, K)),
            (saved.kg, (NT, HV, K)), (saved.v_new, (NT, HV, V)))
    for t, shape in want:
        if t is None or tuple(t.shape) != shape or t.dtype != idt or t.device != dev:
            return None
    return tuple(t.contiguous() for t, _ in want)


def _launch_bwd(do, dht, saved: KDADetSavedSet, plan: KDADetPlan, workspace) -> KDADetGrads:
    q, k, v, g, beta = (t.contiguous() for t in (saved.q, saved.k, saved.v, saved.g, saved.beta))
    h0 = saved.initial_state.contiguous() if saved.initial_state is not None else None
    use_gate = saved.use_gate_in_kernel
    use_sigmoid = beta_code(saved.use_beta_sigmoid_in_kernel, saved.allow_neg_eigval)
    lower_bound = saved.lower_bound if use_gate else None
    A_log = saved.A_log.contiguous() if use_gate and saved.A_log is not None else None
    dt_bias = saved.dt_bias.contiguous() if use_gate and saved.dt_bias is not None else None
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT = B * T
    # the forward's device tables when they suit this device and stream, else copied here
    tabs = saved_chunks(saved, CHUNK_SIZE, q.device).tables_on(q.device)
    # the forward's h, w, kg and v_new when it kept them (plan.keep_states): no chunk prep,
    # no forward state pass; else recomputed (the same kernels on the same inputs)
    states = _kept_states(saved, plan, NT, tabs[4], HV, K, V, inter_dtype(plan, q.dtype),
                          q.device)
    beta_eff = _beta_fwd(beta, use_sigmoid, plan)
    kept = saved.A
    # T and Aqk stacked when the forward kept what this plan loads, else recomputed
    A = kept.contiguous() if kept is not None and \
        kept.dtype == inter_dtype(plan, q.dtype) and \
        tuple(kept.shape) == kept_a_shape(NT, HV) else None
    dq, dk, dv, dg, dbeta, dh0, *parts = kda_chunk_bwd(
        do.contiguous(), dht.contiguous() if dht is not None else None, q, k, v,
        saved.g_cumsum.contiguous(), beta_eff, A, saved.scale, h0, tabs, plan, workspace,
        grad_dtype=q.dtype,
        gate=(g, A_log, dt_bias, lower_bound) if use_gate else None, dg_dtype=g.dtype,
        # the saved q and k are the L2 norm's outputs: its backward runs in the chunk's
        l2norm=(saved.q_rstd.contiguous(), saved.k_rstd.contiguous())
        if saved.use_qk_l2norm else None, states=states)
    # the gate's backward ran in the chunk backward (dg w.r.t. the raw g, per-chunk sums);
    # the sigmoid's in place on dbeta; with no tokens dA_log, ddt_bias are 0
    dbeta = dbeta.contiguous()
    _beta_bwd(beta, dbeta.view(NT, HV), use_sigmoid, plan)
    dA_log, ddt_bias = _gate_param_grads(parts, A_log, dt_bias, HV, K, q.device)
    return KDADetGrads(
        dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype),
        dbeta.to(beta.dtype), dh0, dA_log, ddt_bias)


def _saved_set(q, k, v, g, beta, g_cumsum, A, initial_state, seqs: SeqChunks, q_rstd,
               k_rstd, A_log, dt_bias, scale, use_l2, plan, varlen, use_gate, lower_bound,
               use_sigmoid, kinds: ModeKinds | None = None, states=None) -> KDADetSavedSet:
    """``seqs``: the forward's sequences (:func:`cake_core.varlen.resolve_chunks`): the
    saved ``cu_seqlens`` is their device offsets (shared: read-only), and a backward on the
    same device and stream launches with their tables. ``states``: the forward's kept
    ``(h, w, kg, v_new)`` or None. A saved set of ``kinds`` (default :data:`DET_KINDS`)."""
    kinds = kinds or DET_KINDS
    tensors = (q, k, v, g, beta, g_cumsum, A, initial_state, seqs.cu, q_rstd, k_rstd,
               A_log, dt_bias, *(states if states is not None else (None,) * 4))
    return kinds.saved_type(
        kinds.mode, dict(zip(kinds.saved_type.tensor_names, tensors, strict=True)),
        meta=saved_meta(scale=scale, use_qk_l2norm=use_l2, plan=plan, varlen=varlen,
                        use_gate_in_kernel=use_gate, beta=use_sigmoid, seqs=seqs,
                        lower_bound=lower_bound))


def _contig(t):
    return t.contiguous() if t is not None else None


# ----------------------------------------------------------------------------- entry bodies
# The bodies of the three entries for any ModeKinds: this package's entries run them with
# DET_KINDS, cake-kda-nondet-train's with its own (same checks, launches and bits; the
# objects' types and mode differ).


def run_fwd(kinds: ModeKinds, q, k, v, g, beta, scale, initial_state, output_final_state,
            use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias,
            lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
            workspace):
    """The body of :func:`chunk_kda_det_fwd` for ``kinds``: ``(o, final_state, saved)``."""
    device, N, scale, A_log, dt_bias, lower_bound, sig, plan, seqs = _check_inputs(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        cu_seqlens, use_gate_in_kernel, A_log, dt_bias, lower_bound,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan, kinds)
    B, T, H, K = q.shape
    HV = v.shape[2]
    if seqs is None:  # traced by torch.compile: the values are needed here
        seqs = resolve_chunks(cu_seqlens, B, T, device, CHUNK_SIZE)
    workspace = _resolve_workspace(workspace, plan, device, HV, B * T, seqs.num_chunks,
                                   q.dtype, kinds)
    with torch.no_grad():
        qc, kc, vc, gc, bc = (t.contiguous() for t in (q, k, v, g, beta))
        gate = (use_gate_in_kernel, _contig(A_log), _contig(dt_bias), lower_bound, sig)
        o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states) = _launch_fwd(
            qc, kc, vc, gc, bc, scale, _contig(initial_state), output_final_state,
            use_qk_l2norm_in_kernel, seqs.tables, plan, workspace, gate)
    if use_qk_l2norm_in_kernel:  # the backward needs the norm's outputs, not q and k
        q, k = qn, kn
    saved = _saved_set(q, k, v, g, beta, g_cumsum, A, initial_state, seqs, q_rstd,
                       k_rstd, A_log, dt_bias, scale, use_qk_l2norm_in_kernel, plan,
                       cu_seqlens is not None, use_gate_in_kernel, lower_bound, sig, kinds,
                       states=states)
    return o, ht, saved


def run_bwd(kinds: ModeKinds, do, dht, saved, plan, workspace):
    """The body of :func:`chunk_kda_det_bwd` for ``kinds``: every check, then
    ``kinds.before_bwd`` (before any launch), then the launches; a ``kinds.grads_type``."""
    require_mode(saved, kinds.saved_type, kinds.mode, name="saved")
    device = check_grad_outputs(do, dht, saved)
    plan, workspace = resolve_for_backward(
        saved, plan, workspace, device,
        resolve_plan=lambda *a: _resolve_plan(*a, kinds),
        resolve_workspace=lambda *a: _resolve_workspace(*a, kinds), chunk_size=CHUNK_SIZE)
    if kinds.before_bwd is not None:
        kinds.before_bwd()
    with torch.no_grad():
        gr = _launch_bwd(do, dht, saved, plan, workspace)
    return gr if kinds.grads_type is KDADetGrads else kinds.grads_type(*gr)


def run_autograd(kinds: ModeKinds, q, k, v, g, beta, scale, initial_state, output_final_state,
                 use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias,
                 lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                 workspace, fla_kwargs: dict):
    """The body of :func:`chunk_kda_det` for ``kinds``: ``(o, final_state or None)``
    through the custom ops of ``kinds.namespace`` (:func:`register_ops`)."""
    initial_state, (_, _, scale, A_log, dt_bias, lower_bound, sig, plan, _) = autograd_checks(
        kinds, q, k, v, g, beta, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias, lower_bound,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan, workspace, fla_kwargs)
    call = getattr(torch.ops, kinds.namespace).fwd if torch.compiler.is_compiling() else \
        _EAGER[kinds.namespace].apply
    o, ht, *_ = call(
        q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, output_final_state,
        use_qk_l2norm_in_kernel, use_gate_in_kernel, lower_bound, sig, plan_to_op_fields(plan))
    return o, (ht if output_final_state else None)


def autograd_checks(kinds: ModeKinds, q, k, v, g, beta, scale, initial_state,
                    output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel,
                    A_log, dt_bias, lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                    safe_gate, plan, workspace, fla_kwargs: dict, *,
                    convert_state: bool = True):
    """Every check of the autograd entry of ``kinds`` (:func:`run_autograd`), in its order:
    FLA's keywords, :func:`_check_inputs` with a bf16 / fp16 ``initial_state`` taken as
    fp32, the workspace. Returns ``(initial_state, _check_inputs's tuple)``: the state the
    entry runs with (an fp32 copy of a 16-bit one when ``convert_state``; without it, an
    fp32 stand-in of its shape, for checks that must not copy)."""
    check_fla_compat(fla_kwargs, kinds.entry)
    keep = bool(fla_kwargs.get("disable_recompute", False))  # by truthiness, as FLA
    if isinstance(initial_state, torch.Tensor) and \
            initial_state.dtype in (torch.bfloat16, torch.float16):
        # as FLA, which loads the state as fp32
        initial_state = initial_state.float() if convert_state else \
            initial_state.new_empty((), dtype=torch.float32).expand(initial_state.shape)
    device, N, scale, A_log, dt_bias, lower_bound, sig, plan, seqs = _check_inputs(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        cu_seqlens, use_gate_in_kernel, A_log, dt_bias, lower_bound,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan, kinds, keep)
    if workspace is not None:
        if seqs is not None:
            B, T = q.shape[:2]
            _resolve_workspace(workspace, plan, device, v.shape[2], B * T, seqs.num_chunks,
                               q.dtype, kinds)
        else:  # traced: type, mode and plan only (its capacity needs cu_seqlens' values)
            require_mode(workspace, kinds.workspace_type, kinds.mode, name="workspace")
            workspace.check(plan, device)
    return initial_state, (device, N, scale, A_log, dt_bias, lower_bound, sig, plan, seqs)


# ----------------------------------------------------------------------------- public API


def chunk_kda_det_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, scale: float | None = None,
                      initial_state: torch.Tensor | None = None,
                      output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                      cu_seqlens: torch.Tensor | None = None, *,
                      use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                      dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                      use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                      safe_gate: bool = False, plan: KDADetPlan | None = None,
                      workspace: KDADetWorkspace | None = None):
    """Deterministic chunked Kimi Delta Attention forward, without autograd.

    Same arguments and semantics as FLA's ``chunk_kda`` (forward only; for autograd use
    :func:`chunk_kda_det`). Per sequence and value head, with state S ``[K, V]`` (fp32) and
    a per-channel log decay ``g_t`` ``[K]`` (Kimi Linear, arXiv:2510.26692)::

        S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T
        o_t = scale S^T q_t

    Args:
        q, k: ``[B, T, H, K]``, fp32, bf16 or fp16 (k of q's dtype), 1 <= K <= 256 (on
            CUDA K, V <= 128 and block_k_inner <= 32; fp32 at K > 64 only with
            num_stages_h=1, as the default plan: ``plan.cuda_plan_problem``).
        v: ``[B, T, HV, V]`` of q's dtype, HV a positive multiple of H (value head ``j``
            reads q/k head ``j // (HV // H)``, FLA's GVA), 1 <= V <= 256.
        g: ``[B, T, HV, K]``, fp32 or q's dtype: the per-channel log decay (row c of the
            state is multiplied by ``exp(g_t[c])``), or FLA's raw gate with
            ``use_gate_in_kernel``; finite (not checked: a ``-inf`` as a hard reset makes
            the chunked form's decay ratios NaN and with them the whole output; use a
            finite value such as -30 (``exp(-30)`` ~ 1e-13: a full reset), or start a new
            document in ``cu_seqlens``. Gates in the thousands cost accuracy: the chunk's
            fp32 running sum of gates then spaces its values ~1e-3 apart).
        beta: ``[B, T, HV]``, fp32 or q's dtype (pre-sigmoid with
            ``use_beta_sigmoid_in_kernel``).
        scale: finite > 0, default ``K ** -0.5``.
        initial_state: fp32 ``[N, HV, K, V]`` or ``None`` (zeros); N = B, or the number of
            sequences in ``cu_seqlens`` (the autograd entry :func:`chunk_kda_det` also
            takes bf16 / fp16, upcast to fp32).
        output_final_state: bool; also return the fp32 state after each sequence.
        use_qk_l2norm_in_kernel: bool; L2-normalise q and k per head first
            (``x * rsqrt(sum(x**2) + 1e-6)``, computed in fp32, stored in q's dtype).
        cu_seqlens: int32/int64 ``[N + 1]`` offsets of packed sequences (then B == 1);
            empty sequences allowed; sequences never mix. Read on the host (one sync).
        use_gate_in_kernel: bool; ``g`` is FLA's raw gate and the log decay used is, per
            value head h and channel c with ``x = g + dt_bias.view(HV, K)[h, c]``:
            ``-exp(A_log[h]) * softplus(x)`` (softplus ``x`` above 20, as FLA), or with
            ``lower_bound`` ``lower_bound * sigmoid(exp(A_log[h]) * x)`` (``lower_bound *
            sigmoid(x)`` when A_log is None). Computed in fp32.
        A_log: ``[HV]``, fp32 or q's dtype; required with ``use_gate_in_kernel`` unless
            ``lower_bound`` is given (FLA's rule).
        dt_bias: ``[HV * K]``, fp32 or q's dtype, or ``None`` (0). A_log, dt_bias and
            lower_bound are ignored without ``use_gate_in_kernel``, as in FLA.
        lower_bound: ``None`` or a finite float < 0 (checked even when ignored).
        use_beta_sigmoid_in_kernel: bool; ``sigmoid(beta)`` (fp32) is used.
        allow_neg_eigval: bool; needs ``use_beta_sigmoid_in_kernel`` (as FLA): ``2 *
            sigmoid(beta)`` is used (beta in (0, 2)).
        safe_gate: bool, accepted for drop-in compatibility and validated as FLA (with
            ``use_gate_in_kernel`` it needs ``lower_bound`` in [-5, 0)); it changes nothing
            else: FLA uses it to pick faster tensor-core paths for bounded gates, cake's
            chunk computation is exact for any gate either way.
        plan: a :class:`~cake_kda_det_train.KDADetPlan` for (K, V) (default
            ``make_plan(K, V, q.dtype, device)``).
        workspace: a :class:`~cake_kda_det_train.KDADetWorkspace` for that plan with room
            for the call (default: scratch allocated per call).

    Returns:
        ``(o, final_state, saved)``: o ``[B, T, HV, V]`` in v's dtype; final_state fp32
        ``[N, HV, K, V]`` or ``None``; saved a :class:`~cake_kda_det_train.KDADetSavedSet`
        for :func:`chunk_kda_det_bwd`.

    Determinism: no atomics; each output element is written by one program and every
    reduction runs in a fixed order, so o and final_state are bitwise repeatable for equal
    inputs, plan and hardware.

    Raises:
        ValueError: bad shapes, dtypes, devices, flags, scale, lower_bound, cu_seqlens (with
            B > 1, not starting at 0, decreasing, not ending at T), initial_state of the
            wrong N, a plan or workspace of another type, mode, plan or size, A_log missing
            with ``use_gate_in_kernel`` and no lower_bound, ``safe_gate`` without a
            lower_bound in [-5, 0), A_log / dt_bias of the wrong shape, dtype or device;
            before any allocation or launch. Inputs are never modified.
    """
    return run_fwd(DET_KINDS, q, k, v, g, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias,
                   lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                   workspace)


def chunk_kda_det_bwd(do: torch.Tensor, dht: torch.Tensor | None, saved: KDADetSavedSet, *,
                      plan: KDADetPlan | None = None,
                      workspace: KDADetWorkspace | None = None) -> KDADetGrads:
    """Low-level backward of :func:`chunk_kda_det_fwd`.

    Recomputes the chunk quantities from the saved inputs and the forward's T and Aqk (or
    uses the chunk states the forward kept with ``plan.keep_states``), runs the chunk
    backward (state gradients over the chunks in reverse, fixed order), then the in-kernel
    options' backward: the gate and beta sigmoid (dA_log, ddt_bias: per-block partials
    summed in index order) and the L2 norm. No atomics: bitwise
    repeatable for equal inputs, upstream gradients, plan and hardware.

    Args:
        do: gradient of o, ``[B, T, HV, V]``, fp32/bf16/fp16.
        dht: gradient of final_state, fp32 ``[N, HV, K, V]``, or ``None`` (zero).
        saved: the :class:`~cake_kda_det_train.KDADetSavedSet` of the forward.
        plan: default the forward's (another one must be a det KDADetPlan for the same
            K and V; bits are promised per plan). workspace: as in
            :func:`chunk_kda_det_fwd`.

    Returns:
        :class:`KDADetGrads` ``(dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias)``;
        with the in-kernel gate / beta sigmoid, dg and dbeta are w.r.t. the raw g and the
        pre-sigmoid beta (FLA's derivatives).

    Raises:
        ValueError: a saved set of another type or mode (e.g. a GDN one), ``do`` / ``dht``
            of the wrong shape, dtype or device, a plan or workspace of another type, mode
            or plan; before any launch.
    """
    return run_bwd(DET_KINDS, do, dht, saved, plan, workspace)


# ----------------------------------------------------------------------------- custom ops
# One autograd definition: under torch.compile the entry calls the fwd op, whose registered
# autograd saves what the backward needs and calls the bwd op; eagerly, an autograd.Function over
# the same bodies, setup_context and backward (cake_core.compile.eager_function). The plan crosses
# as its int fields; None-able tensors stay None; outputs that may not exist (final state, L2-norm
# rstds, gradients of absent inputs) are empty fp32 tensors ``[0]``. g_cumsum and A are outputs so
# autograd can save them.


_EAGER: dict[str, type] = {}  # ops namespace -> its eager autograd.Function (register_ops)


def _h_rows(NT: int, N: int) -> int:
    """Rows of the h the fwd op keeps with ``plan.keep_states``: the most chunks N
    sequences of NT tokens can form (its shape must follow from the inputs' shapes under
    ``torch.compile``; the first NC rows are the states)."""
    return max_chunks(NT, N, CHUNK_SIZE)


def _kept_shapes(plan: KDADetPlan, NT, N, HV: int, K: int, V: int):
    """Shapes of the fwd op's kept ``(h, w, kg, v_new)``: ``[0]`` each without
    ``plan.keep_states`` (NT and N may be symbolic: the fake)."""
    if not plan.keep_states:
        return ((0,),) * 4
    return (_h_rows(NT, N), HV, K, V), (NT, HV, K), (NT, HV, K), (NT, HV, V)


def register_ops(kinds: ModeKinds):
    """Register the custom ops ``<kinds.namespace>::fwd`` / ``::bwd`` (with their fakes and
    autograd) over this module's launches; returns ``(fwd_op, bwd_op)``. Called once per
    namespace: here for :data:`DET_KINDS`, by cake-kda-nondet-train for its own."""
    ns = kinds.namespace

    def fwd_run(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                output_final_state, use_l2, use_gate, lower_bound, use_sigmoid, plan_fields,
                exact_rows: bool):
        """:func:`fwd_body`; ``exact_rows``: a kept h has one row per chunk (the eager
        path), else :func:`_h_rows` rows (the op's shape rule)."""
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        B, T = q.shape[:2]
        seqs = resolve_chunks(cu_seqlens, B, T, q.device, CHUNK_SIZE)
        qc, kc, vc, gc, bc = (t.contiguous() for t in (q, k, v, g, beta))
        gate = (use_gate, _contig(A_log), _contig(dt_bias), lower_bound, use_sigmoid)
        NT, HV, K, V = B * T, v.shape[2], q.shape[3], v.shape[3]
        o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states) = _launch_fwd(
            qc, kc, vc, gc, bc, float(scale), _contig(initial_state), output_final_state,
            use_l2, seqs.tables, plan, None, gate,
            h_rows=None if exact_rows else _h_rows(NT, seqs.num_seqs))
        if kn is not None and kn is qn:  # q is k: an op's outputs may not alias
            kn, k_rstd = kn.clone(), k_rstd.clone()
        if plan.keep_states and states is None:  # no tokens: the fake's (empty) shapes
            states = tuple(q.new_empty(shape, dtype=A.dtype) for shape in _kept_shapes(
                plan, NT, seqs.num_seqs, HV, K, V))
        return (o, optional_output(ht, q), optional_output(qn, q), optional_output(kn, q),
                optional_output(q_rstd, q), optional_output(k_rstd, q), g_cumsum, A,
                *(optional_output(t, q) for t in (states or (None,) * 4)))

    def fwd_body(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, initial_state: torch.Tensor | None,
                cu_seqlens: torch.Tensor | None, A_log: torch.Tensor | None,
                dt_bias: torch.Tensor | None, scale: float, output_final_state: bool,
                use_l2: bool, use_gate: bool, lower_bound: float | None, use_sigmoid: int,
                plan_fields: list[int],
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(o, final_state or [0], qn or [0], kn or [0], q_rstd or [0], k_rstd or [0],
        g_cumsum, A, h or [0], w or [0], kg or [0], v_new or [0])`` (q and k L2-normalised
        with the norm; the kept states with ``plan.keep_states``, h with :func:`_h_rows`
        rows); arguments checked by the entry, except the values of
        cu_seqlens (checked here, before any launch: a cache hit when the entry resolved
        them)."""
        return fwd_run(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                       output_final_state, use_l2, use_gate, lower_bound, use_sigmoid,
                       plan_fields, False)

    _fwd_op = torch.library.custom_op(f"{ns}::fwd", mutates_args=())(fwd_body)

    @_fwd_op.register_fake
    def _fwd_fake(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                  output_final_state, use_l2, use_gate, lower_bound, use_sigmoid, plan_fields):
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        f32 = torch.float32
        ht = q.new_empty((N, HV, K, V) if output_final_state else (0,), dtype=f32)
        rstd = (B, T, H) if use_l2 else (0,)
        qk = (B, T, H, K) if use_l2 else (0,)
        idt = inter_dtype(plan, q.dtype)
        A = q.new_empty(kept_a_shape(B * T, HV), dtype=idt)
        kept = _kept_shapes(plan, B * T, N, HV, K, V)
        return (q.new_empty((B, T, HV, V), dtype=v.dtype), ht, q.new_empty(qk),
                k.new_empty(qk), q.new_empty(rstd, dtype=f32), q.new_empty(rstd, dtype=f32),
                q.new_empty((B * T, HV, K), dtype=f32), A,
                *(q.new_empty(shape, dtype=idt if plan.keep_states else f32)
                  for shape in kept))

    def bwd_body(do: torch.Tensor, dht: torch.Tensor | None, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                g_cumsum: torch.Tensor, A: torch.Tensor | None,
                initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                q_rstd: torch.Tensor | None, k_rstd: torch.Tensor | None,
                A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
                h: torch.Tensor, w: torch.Tensor, kg: torch.Tensor, v_new: torch.Tensor,
                scale: float, use_l2: bool, use_gate: bool, lower_bound: float | None,
                use_sigmoid: int, plan_fields: list[int],
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dq, dk, dv, dg, dbeta, dinitial_state or [0], dA_log or [0], ddt_bias or
        [0])``: :func:`_launch_bwd` on a saved set rebuilt from the arguments (after
        ``kinds.before_bwd``; q and k L2-normalised with ``use_l2``, the fwd op's kept
        states, ``[0]`` ones absent).
        ``cu_seqlens``: the forward's device offsets
        (:attr:`cake_core.varlen.SeqChunks.cu`, resolved to the forward's tables: a cache
        hit) or the caller's tensor (traced)."""
        if kinds.before_bwd is not None:
            kinds.before_bwd()
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        B, T = q.shape[:2]
        seqs = resolve_chunks(cu_seqlens, B, T, q.device, CHUNK_SIZE)
        saved = _saved_set(q, k, v, g, beta, g_cumsum,
                           A if A is not None and A.numel() else None, initial_state, seqs,
                           q_rstd if use_l2 else None, k_rstd if use_l2 else None,
                           A_log if use_gate else None, dt_bias if use_gate else None,
                           float(scale), use_l2, plan, cu_seqlens is not None, use_gate,
                           lower_bound if use_gate else None, use_sigmoid, kinds,
                           states=(h, w, kg, v_new) if h.dim() == 4 else None)
        gr = _launch_bwd(do, dht, saved, plan, None)
        return (gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, optional_output(gr.dinitial_state, q),
                optional_output(gr.dA_log, q), optional_output(gr.ddt_bias, q))

    _bwd_op = torch.library.custom_op(f"{ns}::bwd", mutates_args=())(bwd_body)

    @_bwd_op.register_fake
    def _bwd_fake(do, dht, q, k, v, g, beta, g_cumsum, A, initial_state, cu_seqlens, q_rstd,
                  k_rstd, A_log, dt_bias, h, w, kg, v_new, scale, use_l2, use_gate,
                  lower_bound, use_sigmoid, plan_fields):
        f32 = torch.float32
        dh0 = (initial_state.new_empty(initial_state.shape) if initial_state is not None
               else q.new_empty((0,), dtype=f32))
        dA = A_log.new_empty(A_log.shape) if use_gate and A_log is not None else \
            q.new_empty((0,), dtype=f32)
        ddt = dt_bias.new_empty(dt_bias.shape) if use_gate and dt_bias is not None else \
            q.new_empty((0,), dtype=f32)
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                g.new_empty(g.shape), beta.new_empty(beta.shape), dh0, dA, ddt)

    def _setup_context(ctx, inputs, output):
        (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
         output_final_state, use_l2, use_gate, lower_bound, use_sigmoid, plan_fields) = inputs
        _, _, qn, kn, q_rstd, k_rstd, g_cumsum, A, h, w, kg, v_new = output
        if use_l2:  # the backward needs the norm's outputs, not q and k
            q, k = qn, kn
        # no zero grads made for the outputs only the backward reads (memsets of A, states)
        ctx.set_materialize_grads(False)
        cu = autograd_cu_seqlens(cu_seqlens, q, CHUNK_SIZE)  # the forward's device offsets
        ctx.save_for_backward(q, k, v, g, beta, g_cumsum, A, initial_state, cu, q_rstd,
                              k_rstd, A_log, dt_bias, h, w, kg, v_new)
        ctx.scale, ctx.output_final_state, ctx.use_l2 = scale, output_final_state, use_l2
        ctx.use_gate, ctx.lower_bound = use_gate, lower_bound
        ctx.use_sigmoid, ctx.plan_fields = use_sigmoid, plan_fields

    # kinds.before_bwd runs in the bwd op's body (at run time, before any launch), not
    # here: under torch.compile this function is traced when the forward compiles
    def _backward(ctx, do, dht, _dqn, _dkn, _dq_rstd, _dk_rstd, _dg_cumsum, _dA, _dh, _dw,
                  _dkg, _dvn, bwd=_bwd_op):
        (q, k, v, g, beta, g_cumsum, A, h0, cu, q_rstd, k_rstd, A_log, dt_bias,
         h, w, kg, v_new) = ctx.saved_tensors
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias = bwd(
            do, dht if ctx.output_final_state else None, q, k, v, g, beta, g_cumsum, A, h0,
            cu, q_rstd, k_rstd, A_log, dt_bias, h, w, kg, v_new, ctx.scale, ctx.use_l2,
            ctx.use_gate, ctx.lower_bound, ctx.use_sigmoid, ctx.plan_fields)
        need = ctx.needs_input_grad
        return (dq, dk, dv, dg, dbeta, dh0 if h0 is not None and need[5] else None, None,
                dA_log if A_log is not None and ctx.use_gate and need[7] else None,
                ddt_bias if dt_bias is not None and ctx.use_gate and need[8] else None,
                None, None, None, None, None, None, None)

    # not twice differentiable: a second differentiation raises (cake_core.autograd)
    _fwd_op.register_autograd(once_differentiable(_backward), setup_context=_setup_context)
    # eager calls: the same body and autograd without the dispatcher's Python (host time)
    # eager calls: h with one row per chunk (no shape rule to follow outside a trace)
    _EAGER[ns] = eager_function(
        f"_ChunkKDA{kinds.mode.value.capitalize()}Function",
        lambda *args: fwd_run(*args, True), _setup_context,
        once_differentiable(lambda ctx, *grads: _backward(ctx, *grads, bwd=bwd_body)))
    return _fwd_op, _bwd_op


_fwd_op, _bwd_op = register_ops(DET_KINDS)


def chunk_kda_det(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, scale: float | None = None,
                  initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                  use_qk_l2norm_in_kernel: bool = False,
                  cu_seqlens: torch.Tensor | None = None, *,
                  use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                  dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                  use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                  safe_gate: bool = False, plan: KDADetPlan | None = None,
                  workspace: KDADetWorkspace | None = None, **fla_kwargs):
    """Deterministic drop-in for FLA's ``chunk_kda`` (Kimi Delta Attention), with autograd.

    Arguments, shapes and errors as :func:`chunk_kda_det_fwd` (FLA's names and meanings:
    ``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel``, ``A_log``, ``dt_bias``,
    ``lower_bound``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``, ``safe_gate``).
    Pass everything after ``cu_seqlens`` by keyword (FLA's positional order differs there; a
    bool as the 10th positional argument raises ``ValueError``). FLA's other keywords are
    accepted for drop-in calls: the hints ``cu_seqlens_cpu``, ``chunk_indices``,
    ``use_graph`` and ``max_num_seqs`` (ignored), ``disable_recompute`` (below), and
    ``chunk_size=64``, ``state_v_first=False``, ``transpose_state_layout=False``,
    ``head_first=False``, ``cp_context=None``, ``return_intermediate_states=False`` (FLA's
    defaults; another value raises ``ValueError``; context parallelism is
    ``cake-kda-det-train-kcp``). Unlike :func:`chunk_kda_det_fwd`, and as FLA, a bf16 / fp16
    ``initial_state`` is taken (upcast to an fp32 copy first, the caller's tensor unchanged;
    its gradient comes back in its dtype).
    Returns ``(o, final_state)`` (``final_state`` is ``None`` without
    ``output_final_state``). Gradients flow to q, k, v, g, beta, initial_state, A_log and
    dt_bias (through :func:`chunk_kda_det_bwd`); bitwise repeatable for equal inputs,
    upstream gradients, plan and hardware; not twice differentiable. The forward keeps the
    inputs, g's within-chunk cumulative sum (fp32, 4 bytes per token, value head and
    channel), the L2-norm rstds and each chunk's T and Aqk (2 bytes each per token, value
    head and chunk position in 16-bit intermediates) and the fp32 copy of a 16-bit
    ``initial_state``; with ``plan.keep_states`` also the chunk states h, w, kg and v_new
    (the backward then skips their recompute; :func:`saved_bytes` counts all of it).

    ``disable_recompute`` (FLA's flag, tested by truthiness as FLA does; default off): on,
    the forward keeps the chunk states for the backward, as ``plan.keep_states``: less time
    for more memory, the same bits. Without a ``plan`` the call runs the plan it picks
    anyway with ``keep_states = 1``; with a ``plan``, that plan must have
    ``keep_states = 1`` (else ``ValueError`` before any launch: pass
    ``dataclasses.replace(plan, keep_states=1)`` or drop ``disable_recompute``). A value
    without a truth value (an array of several elements) raises ``ValueError``.

    Under ``torch.compile`` (``fullgraph=True`` works) the call is the custom ops
    ``cake_kda_det_train::fwd`` / ``::bwd`` (the plan passed by its fields) with their registered
    autograd; eagerly, the same op bodies and autograd formula as an ``autograd.Function``
    (no dispatcher overhead): the same launches, the same bits. While traced, the
    values of ``cu_seqlens`` are checked when the op runs. A ``workspace`` is checked
    (its capacity too, except while traced) but not used: the ops allocate their scratch
    per call (use :func:`chunk_kda_det_fwd` to run in one). ``torch.utils.checkpoint``
    works.
    """
    return run_autograd(DET_KINDS, q, k, v, g, beta, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel, A_log, dt_bias,
                   lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                   workspace, fla_kwargs)
