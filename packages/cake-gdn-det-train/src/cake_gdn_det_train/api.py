"""Autograd entry and low-level forward/backward of the det chunked Gated DeltaNet.

Math (FLA's ``chunk_gated_delta_rule``; Yang, Kautz & Hatamizadeh, 2024, arXiv:2412.06464):
per sequence and value head, state S ``[K, V]`` in fp32, for each token

    S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = scale S^T q_t

computed on 64-token chunks in the WY/UT form (kernels/fwd_prep.py, the state recurrence
of cake_core.chunk_state, the output of cake_core.chunk_output; backward:
kernels/bwd_dv_local.py, cake_core.chunk_state, kernels/bwd_local.py, after recomputing the
forward's chunk quantities).
FLA's in-kernel gate (``g_t = -exp(A_log) * softplus(g_raw + dt_bias)``) and beta sigmoid
are an elementwise fp32 kernel before the chunk kernels and one after the backward's
(kernels/gate.py), with dA_log / ddt_bias summed in a fixed two-stage order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import Mode, require_mode
from cake_core.autograd import once_differentiable
from cake_core.chunk_output import chunk_output
from cake_core.chunk_state import chunk_state_bwd, chunk_state_fwd
from cake_core.compile import (
    eager_function,
    optional_output,
    plan_from_op_fields,
    plan_to_op_fields,
)
from cake_core.gemm import direct_store_dtype, group_sum_cast, ordered_sum
from cake_core.l2norm import l2norm_bwd, l2norm_fwd
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
    inter_dtype,
    resolve_for_backward,
    resolve_plan,
    resolve_scale,
    resolve_workspace,
    saved_chunks,
    saved_meta,
)
from cake_core.triton_utils import cdiv, is_interpreting, next_power_of_2, tl
from cake_core.varlen import SeqChunks, resolve_chunks

from cake_gdn_det_train.kernels.bwd_dv_local import gdn_bwd_dv_local_kernel
from cake_gdn_det_train.kernels.bwd_local import gdn_bwd_local_kernel
from cake_gdn_det_train.kernels.bwd_local_kblock import (
    gdn_bwd_local_dk_kernel,
    gdn_bwd_local_kblock_kernel,
    gdn_bwd_local_wy_kb_kernel,
)
from cake_gdn_det_train.kernels.fwd_prep import gdn_fwd_prep_kernel
from cake_gdn_det_train.kernels.gate import (
    SOFTPLUS_THRESHOLD,
    gdn_gate_bwd_kernel,
    gdn_gate_fwd_kernel,
)
from cake_gdn_det_train.plan import (
    CHUNK_SIZE,
    MAX_HEAD_DIM,
    NARROWED_FIELDS,
    GDNDetPlan,
    cuda_plan_problem,
    make_plan,
    narrowed_for,
)
from cake_gdn_det_train.saved import GDNDetSavedSet, GDNDetWorkspace, max_chunks, workspace_shapes


class GDNDetGrads(NamedTuple):
    """Gradients of :func:`chunk_gdn_det_bwd`.

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


class ModeTypes(NamedTuple):
    """The mode-carrying types an entry of these launches runs with: this package's
    (:data:`DET`), or cake-gdn-nondet-train's, which runs the same launches with its own
    plan, saved set and workspace classes and registers its own custom ops
    (:func:`define_ops`). An entry refuses objects of another ``mode`` or type."""

    mode: Mode
    plan: type  # GDNDetPlan or its nondet subclass
    saved: type
    workspace: type
    make_plan: Callable  # (K, V, dtype, device, *, state_programs=None) -> plan
    ops: str  # the custom ops' namespace
    plans: dict  # the entries' default plans, per (K, V, dtype, device)
    kept_plans: dict  # their keep_states = 1 copies (disable_recompute=True), per plan
    before_bwd: Callable[[], None] | None = None  # run by a backward before any launch


# ----------------------------------------------------------------------------- checks


def _check_inputs(q, k, v, g, beta, scale, initial_state, output_final_state,
                  use_qk_l2norm_in_kernel, cu_seqlens, use_gate_in_kernel=False, A_log=None,
                  dt_bias=None, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                  plan=None, types: ModeTypes | None = None, disable_recompute: bool = False):
    """All checks of :func:`chunk_gdn_det_fwd`, then the plan; returns ``(device, N, scale,
    A_log, dt_bias, beta code, plan, seqs)``. A_log and dt_bias are checked (and used)
    only with ``use_gate_in_kernel``, as in FLA (``None`` without it). seqs: the call's
    sequences and chunk tables, resolved once (:class:`cake_core.varlen.SeqChunks`,
    read-only; ``None`` while torch.compile traces). ``types``: default :data:`DET`.
    ``disable_recompute``: a plan that keeps the chunk states (:func:`_resolve_plan`)."""
    check_cu_seqlens_position(cu_seqlens)  # before the shape checks: the FLA hint
    B, T, H, K, HV, V = check_qkv_g_beta(q, k, v, g, beta, max_head_dim=MAX_HEAD_DIM,
                                         per_channel_decay=False)
    scale = resolve_scale(scale, K)
    check_options(output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                  use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log: required with use_gate_in_kernel=True (the gate is "
                             "-exp(A_log) * softplus(g + dt_bias))")
        check_gate_params(q.dtype, (A_log, "A_log", [HV]), (dt_bias, "dt_bias", [HV]))
    else:
        A_log = dt_bias = None
    device, N, seqs = check_device_and_state(q, k, v, g, beta, initial_state, cu_seqlens,
                                             A_log, dt_bias, chunk_size=CHUNK_SIZE)
    sig = beta_code(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return (device, N, scale, A_log, dt_bias, sig,
            _resolve_plan(plan, K, V, q.dtype, device, state_programs=N * HV, types=types,
                          disable_recompute=disable_recompute),
            seqs)


_DEFAULT_PLANS: dict[tuple, GDNDetPlan] = {}
_KEPT_PLANS: dict[tuple, GDNDetPlan] = {}

#: this package's types: det plans, saved sets and workspaces, the ops ``cake_gdn_det_train::``
DET = ModeTypes(Mode.DET, GDNDetPlan, GDNDetSavedSet, GDNDetWorkspace, make_plan,
                "cake_gdn_det_train", _DEFAULT_PLANS, _KEPT_PLANS)


def _resolve_plan(plan, K: int, V: int, dtype: torch.dtype, device: torch.device,
                  state_programs: int | None = None, types: ModeTypes | None = None,
                  disable_recompute: bool = False) -> GDNDetPlan:
    """The call's plan: the caller's (checked: ``types.plan`` of ``types.mode``, default
    :data:`DET`), else the rule's for (K, V, dtype, device), narrowed by
    :func:`make_plan`'s ``state_programs`` rule when ``state_programs`` (``N * HV``) is
    given. With ``disable_recompute`` (FLA's keyword): the rule's plan with
    ``keep_states = 1`` (one object per plan, kept in ``types.kept_plans``), or the
    caller's when it keeps the states
    (:func:`cake_core.linear_attention.disable_recompute_plan`: ``ValueError`` for a
    caller's plan with ``keep_states = 0``)."""
    types = types or DET
    got = resolve_plan(plan, K, V, dtype, device, plan_type=types.plan,
                       make_plan=types.make_plan, cuda_plan_problem=cuda_plan_problem,
                       cache=types.plans, mode=types.mode)
    if plan is None and state_programs is not None:
        got = narrowed_for(got, dtype, device, state_programs)
    if disable_recompute:
        got = disable_recompute_plan(got, plan, types.kept_plans)
    return got


_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_dtype(plan: GDNDetPlan, dtype: torch.dtype):
    """``DT`` of the kernels: the intermediates' dtype on CUDA, fp32 under the interpreter
    (its bf16 ``tl.dot`` is wrong in Triton 3.6)."""
    return tl.float32 if is_interpreting() else _TL[inter_dtype(plan, dtype)]


def _without_narrowed_fields(plan: GDNDetPlan) -> dict:
    d = plan.to_dict()
    for name in NARROWED_FIELDS:
        d.pop(name)
    return d


def _resolve_workspace(workspace, plan: GDNDetPlan, device: torch.device, HV: int, NT: int,
                       NC: int, dtype: torch.dtype, types: ModeTypes | None = None):
    """The caller's workspace after every check (``None`` stays ``None``; a
    ``types.workspace`` of ``types.mode``, default :data:`DET`). A workspace made for a
    plan that differs from the call's in ``block_v_h`` / ``num_warps_h`` only serves it (the
    buffers are the same; :func:`make_plan`'s ``state_programs`` rule may narrow the
    default)."""
    types = types or DET
    own = getattr(workspace, "plan", None)
    if isinstance(workspace, types.workspace) and isinstance(own, types.plan) and \
            own != plan and _without_narrowed_fields(own) == _without_narrowed_fields(plan):
        plan = own
    return resolve_workspace(workspace, plan, device, workspace_type=types.workspace,
                             buffer_shapes=workspace_shapes(plan, HV),
                             buffer_dtype=inter_dtype(plan, dtype), tokens=NT, chunks=NC,
                             mode=types.mode)


# ----------------------------------------------------------------------------- launches


def _l2norm(x: torch.Tensor, plan: GDNDetPlan):
    """cake-core's q/k L2 norm (``x * rsqrt(sum(x**2) + 1e-6)`` over the last dim, computed
    in fp32, stored in x's dtype, as FLA) with this plan's launch fields; returns
    ``(y, fp32 rstd per row)``. x is contiguous."""
    return l2norm_fwd(x, block_rows=plan.l2norm_block_rows, block_k=plan.block_k,
                      num_warps=4)


def _l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, plan: GDNDetPlan):
    """The q/k L2 norm's backward from its outputs y, rstd (cake-core's kernel, the
    forward's launch fields): dx in y's dtype."""
    return l2norm_bwd(y, rstd, dy, block_rows=plan.l2norm_block_rows, block_k=plan.block_k,
                      num_warps=4)


def _scratch(workspace, NT: int, NC: int, HV: int, K: int, V: int, dev, idt: torch.dtype,
             keep: bool = False, h_rows: int | None = None):
    """w, u, v_new ``[NT, HV, *]`` and h ``[NC, HV, K, V]`` (dtype ``idt``): views of the
    workspace's leading rows, or fresh tensors. ``keep``: w, v_new and h are always fresh
    (a saved set keeps them past the call; a later call would overwrite a workspace's).
    ``h_rows``: a fresh h has that many rows (>= NC; the kernels use the first NC)."""
    def fresh(*shape):
        return torch.empty(shape, dtype=idt, device=dev)

    nh = NC if h_rows is None else h_rows
    if workspace is None:
        return fresh(NT, HV, K), fresh(NT, HV, V), fresh(NT, HV, V), fresh(nh, HV, K, V)
    if keep:
        return fresh(NT, HV, K), workspace["u"][:NT], fresh(NT, HV, V), fresh(nh, HV, K, V)
    return (workspace["w"][:NT], workspace["u"][:NT], workspace["v_new"][:NT],
            workspace["h"][:NC])


def _rec_opts(plan: GDNDetPlan, DT) -> dict:
    """The state kernels' (cake_core.chunk_state) form and launch: scalar decay;
    ``rec_form = 1`` the decays on the ``[64, block_v_h]`` tiles and a one-axis grid, V
    blocks fastest; ``rec_form = 0`` the decays on the ``[64, K]`` tiles, grid (sequence,
    value head, V block)."""
    return dict(dot_dtype=DT, precision=plan.dot_precision, block_k=plan.block_k,
                block_v=plan.block_v_h, per_channel=False, decay_on_v=plan.rec_form == 1,
                flat_grid=plan.rec_form == 1, num_warps=plan.num_warps_h,
                num_stages=plan.num_stages_h, chunk_size=CHUNK_SIZE)


def _prep_and_state(k, v, g, beta, initial_state, ht, plan, dev_tables, g_cumsum, A, scratch,
                    load_a: bool = False):
    """Chunk prep (G, T, w, u) and the forward state recurrence (h, v_new, final state)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    starts, ends, chunk_off, cu_dev, NC = dev_tables
    w, u, v_new, h = scratch
    BT = CHUNK_SIZE
    DT = _dot_dtype(plan, k.dtype)
    gdn_fwd_prep_kernel[(NC, HV)](
        k, v, g, beta, starts, ends, g_cumsum, A, w, u,
        H, HV, HV // H, K, V,
        DT=DT, PREC=plan.dot_precision, BT=BT, LOG2_BT=BT.bit_length() - 1, BK=plan.block_k,
        BVF=max(16, next_power_of_2(V)), LOAD_A=load_a,
        num_warps=4)
    chunk_state_fwd(k, w, u, g_cumsum, cu_dev, chunk_off, initial_state, h, v_new, ht,
                    H=H, HV=HV, K=K, V=V, **_rec_opts(plan, DT))


def _gate_fwd(g, beta, A_log, dt_bias, use_gate: bool, use_sigmoid: int, plan: GDNDetPlan):
    """The log-decay and beta the chunk kernels use: fp32 ``[B, T, HV]`` computed from the
    raw g (``-exp(A_log) * softplus(g + dt_bias)``) and pre-sigmoid beta where the options
    say so, else the tensors given. Inputs contiguous."""
    if not (use_gate or use_sigmoid):
        return g, beta
    HV = g.shape[-1]
    NT = g.numel() // HV if HV else 0
    f32 = torch.float32
    g_out = torch.empty(g.shape, dtype=f32, device=g.device) if use_gate else g
    b_out = torch.empty(beta.shape, dtype=f32, device=g.device) if use_sigmoid else beta
    if NT:
        gdn_gate_fwd_kernel[(cdiv(NT, plan.gate_block_t),)](
            g, beta, A_log if use_gate else g, dt_bias if dt_bias is not None else g,
            g_out, b_out, NT, HV,
            USE_GATE=use_gate, HAS_BIAS=dt_bias is not None, BETA_SIGMOID=use_sigmoid,
            THRESHOLD=SOFTPLUS_THRESHOLD, BLOCK_T=plan.gate_block_t, BH=max(2, next_power_of_2(HV)),
            num_warps=4)
    return g_out, b_out


def _gate_bwd(g, beta, A_log, dt_bias, dg, dbeta, use_gate: bool, use_sigmoid: int,
              plan: GDNDetPlan):
    """In place: dg, dbeta (fp32 ``[NT, HV]``, w.r.t. the gate / post-sigmoid beta) become
    the gradients w.r.t. the raw g / pre-sigmoid beta. Returns ``(dA_log, ddt_bias)``
    (``None`` where not used): per-block fp32 partials, then a sum over the blocks in index
    order (ordered_sum; no atomics), cast once to A_log's / dt_bias's dtype."""
    if not (use_gate or use_sigmoid):
        return None, None
    NT, HV = dg.shape
    NB = cdiv(NT, plan.gate_block_t)
    dev = dg.device
    f32 = torch.float32
    has_bias = use_gate and dt_bias is not None
    da_part = torch.empty((NB, HV), dtype=f32, device=dev) if use_gate else dg
    db_part = torch.empty((NB, HV), dtype=f32, device=dev) if has_bias else dg
    if NB:
        gdn_gate_bwd_kernel[(NB,)](
            g, beta, A_log if use_gate else g, dt_bias if has_bias else g,
            dg, dbeta, da_part, db_part, NT, HV,
            USE_GATE=use_gate, HAS_BIAS=has_bias, BETA_SIGMOID=use_sigmoid,
            THRESHOLD=SOFTPLUS_THRESHOLD, BLOCK_T=plan.gate_block_t, BH=max(2, next_power_of_2(HV)),
            num_warps=4)
    if not use_gate:
        return None, None
    # fp32 sums, cast once on the host (the interpreter's in-kernel bf16 cast truncates)
    dA_log = ordered_sum(da_part, out=torch.empty((HV,), dtype=f32, device=dev))
    ddt_bias = None
    if has_bias:
        ddt_bias = ordered_sum(db_part, out=torch.empty((HV,), dtype=f32, device=dev))
        ddt_bias = ddt_bias.to(dt_bias.dtype)
    return dA_log.to(A_log.dtype), ddt_bias


def _launch_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, use_l2,
                plan: GDNDetPlan, workspace, dt, gate=(False, None, None, False),
                h_rows: int | None = None):
    """Allocates outputs and saved tensors, launches; inputs are contiguous. ``dt``: the
    device chunk tables ``(starts, ends, chunk_off, cu, NC)``
    (:attr:`cake_core.varlen.SeqChunks.tables`). ``gate``:
    ``(use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel)``, tensors
    contiguous. Returns ``(o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states))``; ``qn``,
    ``kn``: q and k L2-normalised (the backward keeps them: the norm's backward needs only
    its outputs), None without the norm (one tensor when q is k); ``states``:
    ``(h, w, v_new)`` in fresh tensors when ``plan.keep_states`` and there is a token, else
    ``None`` (h with ``h_rows`` rows when given: see :func:`_scratch`)."""
    keep_states = bool(plan.keep_states)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, N = B * T, dt[3].numel() - 1
    dev = q.device
    f32 = torch.float32
    NC = dt[4]
    q_rstd = k_rstd = qn = kn = None
    if use_l2:
        qn, q_rstd = _l2norm(q, plan)
        kn, k_rstd = (qn, q_rstd) if k is q else _l2norm(k, plan)
        q, k = qn, kn
    o = torch.empty((B, T, HV, V), dtype=v.dtype, device=dev)
    g_cumsum = torch.empty((NT, HV), dtype=f32, device=dev)
    idt = inter_dtype(plan, q.dtype)
    A = torch.empty((NT, HV, CHUNK_SIZE), dtype=idt, device=dev)
    ht = torch.empty((N, HV, K, V), dtype=f32, device=dev) if output_final_state else None
    if NC == 0:  # no tokens at all: every final state is its initial state
        if ht is not None:
            if initial_state is not None:
                ht.copy_(initial_state)
            else:
                ht.zero_()
        return o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, None)
    use_gate, A_log, dt_bias, use_sigmoid = gate
    g, beta = _gate_fwd(g, beta, A_log, dt_bias, use_gate, use_sigmoid, plan)
    scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt, keep_states, h_rows)
    _prep_and_state(k, v, g, beta, initial_state, ht, plan, dt, g_cumsum, A, scratch)
    w, _, v_new, h = scratch
    chunk_output(q, k, g_cumsum, None, v_new, h, dt[0], dt[1], o, scale, chunks=NC, H=H, HV=HV,
                 K=K, V=V, dot_dtype=_dot_dtype(plan, q.dtype), precision=plan.dot_precision,
                 block_k=plan.block_k, block_v=plan.block_v, per_channel=False, num_warps=4,
                 chunk_size=CHUNK_SIZE)
    return o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A,
                   (h, w, v_new) if keep_states else None)


def _kept_states(saved: GDNDetSavedSet, plan: GDNDetPlan, NT: int, NC: int, HV: int, K: int,
                 V: int, idt: torch.dtype, dev: torch.device):
    """``(g_cumsum, A, w, v_new, h)`` the forward kept (``plan.keep_states``), contiguous,
    when all are there with this call's shapes, dtypes and device and the backward's plan
    is the forward's (the kept bits are those its recompute would give); else ``None``.
    h may have more than NC rows (the custom op's; the first NC are the states)."""
    if saved.h is None or plan != saved.meta.get("plan") or saved.h.shape[0] < NC:
        return None
    want = ((saved.g_cumsum, (NT, HV), torch.float32), (saved.A, (NT, HV, CHUNK_SIZE), idt),
            (saved.w, (NT, HV, K), idt), (saved.v_new, (NT, HV, V), idt),
            (saved.h[:NC], (NC, HV, K, V), idt))
    for t, shape, dtype in want:
        if t is None or tuple(t.shape) != shape or t.dtype != dtype or t.device != dev:
            return None
    return tuple(t.contiguous() for t, _, _ in want)


def _local_kblock(qn, kn, v, beta_eff, g_cumsum, A, h, dh, do_c, dv_new, v_new, dt,
                  dq_hv, dk_hv, dv, dg, dbeta, scale, H, HV, K, V, NC, DT, plan: GDNDetPlan,
                  dq_out, dk_out, l2=None):
    """``plan.local_form = 2``: the chunk-local gradients in three kernels
    (kernels/bwd_local_kblock.py): K-block programs, their partial dT (64 x 64 per chunk,
    value head and K block) and row sums through workspaces, added in K-block order by the
    WY kernel, which stores the ``[64, 64]`` matrix z per chunk that the dk kernel's terms
    need in an fp32 ``[NT, HV, 64]`` scratch. ``dq_hv``: the first kernel's dq per value
    head (fp32, or the gradients' dtype with one value head per q/k head); ``dk_hv``: its
    fp32 partial dk; ``dq_out`` / ``dk_out``: ``[NT, H, K]``, the value-head sums.
    ``l2``: ``(q_rstd, k_rstd)`` (fp32; qn and kn are the norm's outputs) to apply the L2
    norm's backward in the kernels (``plan.l2norm_local``, one K block), else None."""
    NT = dq_hv.shape[0]
    dz = torch.empty((NT, HV, CHUNK_SIZE), dtype=torch.float32, device=dq_hv.device)
    BK, BV = plan.block_k_local, plan.block_v_local
    NK = cdiv(K, BK)
    # dT's parts in the intermediates' dtype (faster, and as accurate: dT is cast to that
    # dtype for its dots anyway; docs/benchmarks/gdn.md), row sums fp32
    wt = torch.empty((NT, HV, NK * CHUNK_SIZE), dtype=h.dtype, device=dq_hv.device)
    wv = torch.empty((NK, 2, NT, HV), dtype=torch.float32, device=dq_hv.device)
    G = HV // H
    xq, xk = qn, kn  # the norm's backward reads its outputs' rows
    rq, rk = l2 if l2 is not None else (qn, qn)
    gdn_bwd_local_kblock_kernel[(NC, HV, NK)](
        qn, kn, beta_eff, g_cumsum, A, h, dh, do_c, dv_new, v_new, dt[0], dt[1],
        dq_hv, dk_hv, wt, wv, NT, xq, rq,
        scale, H, HV, G, K, V,
        DT=DT, PREC=plan.dot_precision, BT=CHUNK_SIZE, BK=BK, NK=NK,
        BV=BV, NV=cdiv(V, BV), L2Q=l2 is not None and G == 1,
        num_warps=plan.num_warps_local)
    gdn_bwd_local_wy_kb_kernel[(NC, HV)](
        kn, v, beta_eff, g_cumsum, A, dv_new, dt[0], dt[1], wt, wv, NT,
        dv, dg, dbeta, dz,
        H, HV, HV // H, K, V,
        DT=DT, PREC=plan.dot_precision, BT=CHUNK_SIZE, BK=BK, NK=NK,
        BV=BV, NV=cdiv(V, BV), num_warps=4)
    gdn_bwd_local_dk_kernel[(NC, H, cdiv(K, BK))](
        kn, dt[0], dt[1], dz, dk_hv, dk_out, dq_hv, dq_out, xq, rq, xk, rk, H, HV, G, K,
        DT=DT, PREC=plan.dot_precision, BT=CHUNK_SIZE, BK=BK, SUM_DQ=G > 1,
        L2=l2 is not None, num_warps=4)


def _launch_bwd(do, dht, saved: GDNDetSavedSet, plan: GDNDetPlan, workspace):
    q, k, v, g, beta = (t.contiguous() for t in (saved.q, saved.k, saved.v, saved.g, saved.beta))
    h0 = saved.initial_state.contiguous() if saved.initial_state is not None else None
    use_gate = saved.use_gate_in_kernel
    use_sigmoid = beta_code(saved.use_beta_sigmoid_in_kernel, saved.allow_neg_eigval)
    A_log = saved.A_log.contiguous() if use_gate else None
    dt_bias = saved.dt_bias.contiguous() if use_gate and saved.dt_bias is not None else None
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT = B * T
    dev = q.device
    # the forward's device tables when they suit this device and stream, else copied here
    dt = saved_chunks(saved, CHUNK_SIZE, dev).tables_on(dev)
    N, NC = dt[3].numel() - 1, dt[4]
    f32 = torch.float32
    qn, kn = q, k  # with the L2 norm the saved q and k are its outputs
    # every token lies in a chunk, so the local kernel writes every row of these
    # local_form = 2: the local kernels store dq and dk [NT, H, K] in the gradients'
    # dtype themselves (the value-head sum and its cast fused into the dk kernel; with one
    # value head per q/k head the first kernel stores dq as it is): no group_sum_cast pass
    # (two elementwise passes fewer in the backward). The same bits: the same fp32 adds in
    # index order, both casts round to nearest even (under the interpreter bf16 stays fp32
    # and torch casts, as group_sum_cast does there)
    G = HV // H
    fused = bool(plan.local_form)
    # the L2 norm's backward inside the local kernels: they hold whole rows (one K block)
    l2_local = saved.use_qk_l2norm and fused and bool(plan.l2norm_local) and \
        plan.block_k_local >= K
    gdt = f32 if saved.use_qk_l2norm and not l2_local else q.dtype
    odt = direct_store_dtype(gdt)
    dq_hv = torch.empty((NT, HV, K), dtype=odt if fused and G == 1 else f32, device=dev)
    dk_hv = torch.empty((NT, HV, K), dtype=f32, device=dev)
    dq_out = dk_out = None
    if fused:
        dq_out = dq_hv if G == 1 else torch.empty((NT, H, K), dtype=odt, device=dev)
        dk_out = dk_hv if G == 1 and odt == f32 else \
            torch.empty((NT, H, K), dtype=odt, device=dev)
    # dv is stored once, so the kernel writes v's dtype (rounded to nearest even; under the
    # interpreter, whose bf16 cast truncates, fp32 here and cast by torch below)
    dv = torch.empty((NT, HV, V), dtype=direct_store_dtype(v.dtype), device=dev)
    dg = torch.empty((NT, HV), dtype=f32, device=dev)
    dbeta = torch.empty((NT, HV), dtype=f32, device=dev)
    dh0 = None
    if h0 is not None:
        dh0 = torch.empty((N, HV, K, V), dtype=f32, device=dev)
    if NC == 0:
        if dh0 is not None:
            if dht is not None:
                dh0.copy_(dht)
            else:
                dh0.zero_()
    else:
        idt = inter_dtype(plan, q.dtype)
        DT = _dot_dtype(plan, q.dtype)
        g_eff, beta_eff = _gate_fwd(g, beta, A_log, dt_bias, use_gate, use_sigmoid, plan)
        # the forward's g_cumsum, T, w, v_new and h when it kept them (plan.keep_states):
        # no chunk prep, no forward recurrence; else recomputed (the same kernels on the
        # same inputs: the same bits)
        states = _kept_states(saved, plan, NT, NC, HV, K, V, idt, dev)
        if states is not None:
            g_cumsum, A, w, v_new, h = states
        else:
            scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt)
            g_cumsum = torch.empty((NT, HV), dtype=f32, device=dev)
            # the forward's T when it kept one of this plan's dtype (same bits as recomputing)
            kept = saved.A
            load_a = kept is not None and kept.dtype == idt and \
                tuple(kept.shape) == (NT, HV, CHUNK_SIZE)
            A = kept.contiguous() if load_a else \
                torch.empty((NT, HV, CHUNK_SIZE), dtype=idt, device=dev)
            _prep_and_state(kn, v, g_eff, beta_eff, h0, None, plan, dt, g_cumsum, A, scratch,
                            load_a)
            w, _, v_new, h = scratch
        dh = torch.empty((NC, HV, K, V), dtype=idt, device=dev)
        dv_new = torch.empty((NT, HV, V), dtype=idt, device=dev)
        do_c = do.contiguous()
        dht_c = dht.contiguous() if dht is not None else None
        gdn_bwd_dv_local_kernel[(NC, HV, cdiv(V, plan.block_v))](
            qn, kn, g_cumsum, do_c, dt[0], dt[1], dv_new,
            saved.scale, H, HV, HV // H, K, V,
            DT=DT, PREC=plan.dot_precision, BT=CHUNK_SIZE, BK=plan.block_k, BV=plan.block_v,
            num_warps=4)
        chunk_state_bwd(qn, kn, w, g_cumsum, None, do_c, dt[3], dt[2], dht_c, dh, dv_new, dh0,
                        saved.scale, H=H, HV=HV, K=K, V=V, **_rec_opts(plan, DT))
        if plan.local_form:
            l2 = (saved.q_rstd.contiguous(), saved.k_rstd.contiguous()) if l2_local else None
            _local_kblock(qn, kn, v, beta_eff, g_cumsum, A, h, dh, do_c, dv_new, v_new, dt,
                         dq_hv, dk_hv, dv, dg, dbeta, saved.scale, H, HV, K, V, NC, DT, plan,
                         dq_out, dk_out, l2)
        else:
            gdn_bwd_local_kernel[(NC, HV)](
                qn, kn, v, beta_eff, g_cumsum, A, h, dh, do_c, dv_new, v_new, dt[0], dt[1],
                dq_hv, dk_hv, dv, dg, dbeta,
                saved.scale, H, HV, HV // H, K, V,
                DT=DT, PREC=plan.dot_precision, BT=CHUNK_SIZE, BK=plan.block_k,
                BV=plan.block_v_local, NV=cdiv(V, plan.block_v_local),
                num_warps=plan.num_warps_local)
    # gate / sigmoid backward (in place on dg, dbeta); with no tokens dA_log, ddt_bias are 0
    dA_log, ddt_bias = _gate_bwd(g, beta, A_log, dt_bias, dg, dbeta, use_gate, use_sigmoid,
                                 plan)
    # the fixed-order sum over each q/k head's value heads, fused with the cast (fp32 when the
    # L2 norm's backward follows)
    if fused:  # summed and cast by the kernels (bf16 under the interpreter: cast by .to below)
        dq, dk = dq_out.view(B, T, H, K), dk_out.view(B, T, H, K)
    else:
        dq = group_sum_cast(dq_hv, H, gdt).view(B, T, H, K)
        dk = group_sum_cast(dk_hv, H, gdt).view(B, T, H, K)
    if saved.use_qk_l2norm and not (l2_local and NC):  # one launch each, dx in q's dtype
        dq = _l2norm_bwd(qn, saved.q_rstd, dq, plan)
        dk = _l2norm_bwd(kn, saved.k_rstd, dk, plan)
    return GDNDetGrads(
        dq.to(q.dtype), dk.to(k.dtype), dv.view(B, T, HV, V).to(v.dtype),
        dg.view(B, T, HV).to(g.dtype), dbeta.view(B, T, HV).to(beta.dtype), dh0, dA_log,
        ddt_bias)


# ----------------------------------------------------------------------------- public API


def chunk_gdn_det_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, scale: float | None = None,
                      initial_state: torch.Tensor | None = None,
                      output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                      cu_seqlens: torch.Tensor | None = None, *,
                      plan: GDNDetPlan | None = None,
                      workspace: GDNDetWorkspace | None = None,
                      use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                      dt_bias: torch.Tensor | None = None,
                      use_beta_sigmoid_in_kernel: bool = False,
                      allow_neg_eigval: bool = False):
    """Deterministic chunked Gated DeltaNet forward, without autograd.

    Same arguments and semantics as FLA's ``chunk_gated_delta_rule`` (forward only; for
    autograd use :func:`chunk_gated_delta_rule_det`).

    Args:
        q, k: ``[B, T, H, K]``, fp32, bf16 or fp16 (k of q's dtype). 1 <= K <= 256 (on
            CUDA K, V <= 128, and K <= 64 for fp32 inputs or V <= 16:
            :func:`cuda_plan_problem`).
        v: ``[B, T, HV, V]`` of q's dtype, HV a positive multiple of H (value head ``j``
            reads q/k head ``j // (HV // H)``). 1 <= V <= 256.
        g: ``[B, T, HV]`` log-space decay (state multiplied by ``exp(g_t)``), fp32 or q's
            dtype; finite (not checked: a ``-inf`` as a hard reset makes the chunked form's
            decay ratios ``exp(G_i - G_j)`` NaN and with them the whole output; use a
            finite value such as -30 (``exp(-30)`` ~ 1e-13: a full reset), or start a new
            document in ``cu_seqlens``. Gates in the thousands cost accuracy: the chunk's
            fp32 running sum of gates then spaces its values ~1e-3 apart).
            beta: ``[B, T, HV]``, fp32 or q's dtype.
        scale: > 0, default ``K ** -0.5``.
        initial_state: fp32 ``[N, HV, K, V]`` or ``None`` (zeros); N = B, or the number of
            sequences in ``cu_seqlens``.
        output_final_state: bool; also return the fp32 state after each sequence.
        use_qk_l2norm_in_kernel: bool; L2-normalise q and k per head first
            (``x * rsqrt(sum(x**2) + 1e-6)``, in fp32, in a small kernel).
        cu_seqlens: int32/int64 ``[N + 1]`` offsets of packed sequences (then B == 1); empty
            sequences are allowed. Sequences never mix. Read on the host (one sync).
        plan: a :class:`GDNDetPlan` for (K, V) (default ``make_plan(K, V, q.dtype, device)``).
        workspace: a :class:`GDNDetWorkspace` for that plan with room for the call
            (default: scratch allocated per call).
        use_gate_in_kernel: bool; ``g`` is FLA's raw gate and the log-decay used is
            ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` per value head h (fp32; softplus
            is ``x`` for ``x >= 20``, as in FLA).
        A_log: ``[HV]``, fp32 or q's dtype; required with ``use_gate_in_kernel``.
        dt_bias: ``[HV]``, fp32 or q's dtype, or ``None`` (0). A_log and dt_bias are
            ignored (not checked) without ``use_gate_in_kernel``, as in FLA.
        use_beta_sigmoid_in_kernel: bool; ``beta`` is pre-sigmoid and ``sigmoid(beta)``
            (fp32) is used.
        allow_neg_eigval: bool; with ``use_beta_sigmoid_in_kernel`` (required, as in FLA),
            ``2 * sigmoid(beta)`` is used (beta in (0, 2): the transition may have negative
            eigenvalues; Grazzi et al., 2025, "Unlocking State-Tracking in Linear RNNs
            Through Negative Eigenvalues").

    Returns:
        ``(o, final_state, saved)``: o ``[B, T, HV, V]`` in q's dtype; final_state fp32
        ``[N, HV, K, V]`` or ``None``; saved a :class:`GDNDetSavedSet` for
        :func:`chunk_gdn_det_bwd`.

    Numerics: states, cumulative decays, the chunk solve and every accumulation are fp32;
    with bf16/fp16 inputs and ``plan.store_16bit`` (the default) the chunk intermediates
    are stored, and the big dots take operands, in the inputs' dtype, as FLA does (fp32
    inputs: fp32 operands at ``plan.fp32_dots`` precision). o is cast once to q's dtype.
    Determinism: no atomics; each output element is written by one program, the chunk
    recurrence runs in a fixed order, so o and final_state are bitwise repeatable for equal
    inputs, plan and hardware.

    Raises:
        ValueError: bad shapes, dtypes, devices, flags, scale, cu_seqlens (with B > 1, not
            starting at 0, decreasing, not ending at T), initial_state of the wrong N,
            plan or workspace, A_log missing with ``use_gate_in_kernel``, A_log / dt_bias
            not ``[HV]`` of fp32 or q's dtype on the inputs' device; before any allocation
            or launch. Inputs are never modified.
    """
    return fwd_entry(DET, q, k, v, g, beta, scale, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel, cu_seqlens, plan, workspace, use_gate_in_kernel,
                     A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval)


def fwd_entry(types: ModeTypes, q, k, v, g, beta, scale, initial_state, output_final_state,
              use_qk_l2norm_in_kernel, cu_seqlens, plan, workspace, use_gate_in_kernel, A_log,
              dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval):
    """The body of :func:`chunk_gdn_det_fwd` with ``types`` (:class:`ModeTypes`): its
    plans, workspaces and saved sets."""
    device, N, scale, A_log, dt_bias, sig, plan, seqs = _check_inputs(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        cu_seqlens, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, plan, types)
    B, T, H, K = q.shape
    HV = v.shape[2]
    if seqs is None:  # traced by torch.compile: the values are needed here
        seqs = resolve_chunks(cu_seqlens, B, T, device, CHUNK_SIZE)
    workspace = _resolve_workspace(workspace, plan, device, HV, B * T, seqs.num_chunks,
                                   q.dtype, types)
    with torch.no_grad():
        qc, kc, vc, gc, bc = (t.contiguous() for t in (q, k, v, g, beta))
        h0 = initial_state.contiguous() if initial_state is not None else None
        gate = _gate_args(use_gate_in_kernel, A_log, dt_bias, sig)
        o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states) = _launch_fwd(
            qc, kc, vc, gc, bc, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
            plan, workspace, seqs.tables, gate)
    if use_qk_l2norm_in_kernel:  # the backward needs the norm's outputs, not q and k
        q, k = qn, kn
    saved = _saved_set(q, k, v, g, beta, g_cumsum, A, initial_state, seqs, q_rstd,
                       k_rstd, A_log, dt_bias, scale, use_qk_l2norm_in_kernel, plan,
                       cu_seqlens is not None, use_gate_in_kernel, sig, states=states,
                       types=types)
    return o, ht, saved


def _gate_args(use_gate, A_log, dt_bias, use_sigmoid):
    """``(use_gate, A_log, dt_bias, use_sigmoid)`` with contiguous tensors (or None)."""
    return (use_gate, A_log.contiguous() if A_log is not None else None,
            dt_bias.contiguous() if dt_bias is not None else None, use_sigmoid)


def _saved_set(q, k, v, g, beta, g_cumsum, A, initial_state, seqs: SeqChunks, q_rstd,
               k_rstd, A_log, dt_bias, scale, use_l2, plan, varlen, use_gate, use_sigmoid,
               states=None, types: ModeTypes | None = None) -> GDNDetSavedSet:
    """``seqs``: the forward's sequences (:func:`cake_core.varlen.resolve_chunks`): the
    saved ``cu_seqlens`` is their device offsets (shared: read-only), and a backward on the
    same device and stream launches with their tables. ``states``: the kept
    ``(h, w, v_new)`` or ``None``. A ``types.saved`` of ``types.mode`` (default
    :data:`DET`)."""
    types = types or DET
    h, w, v_new = states if states is not None else (None, None, None)
    tensors = (q, k, v, g, beta, g_cumsum, A, initial_state, seqs.cu, q_rstd, k_rstd,
               A_log, dt_bias, h, w, v_new)
    return types.saved(
        types.mode, dict(zip(types.saved.tensor_names, tensors, strict=True)),
        meta=saved_meta(scale=scale, use_qk_l2norm=use_l2, plan=plan, varlen=varlen,
                        use_gate_in_kernel=use_gate, beta=use_sigmoid, seqs=seqs))


def chunk_gdn_det_bwd(do: torch.Tensor, dht: torch.Tensor | None, saved: GDNDetSavedSet, *,
                      plan: GDNDetPlan | None = None,
                      workspace: GDNDetWorkspace | None = None) -> GDNDetGrads:
    """Low-level backward of :func:`chunk_gdn_det_fwd`.

    Recomputes the chunk quantities (w, u, the states at chunk starts, v_new) from the saved
    inputs (or, when the forward kept them, ``plan.keep_states``, and ``plan`` is the
    forward's, reads them from ``saved``: same bits), runs the state-gradient recurrence over
    the chunks in reverse (fixed order), then the chunk-local gradients; q/k gradients of
    value heads sharing a q/k head are added in index order. No atomics: the result is
    bitwise repeatable for equal inputs and plan.

    Args:
        do: gradient of o, ``[B, T, HV, V]``, fp32/bf16/fp16.
        dht: gradient of final_state, fp32 ``[N, HV, K, V]``, or ``None`` (zero).
        saved: the :class:`GDNDetSavedSet` of the forward.
        plan: default: the forward's. workspace: as in :func:`chunk_gdn_det_fwd`.

    Returns:
        :class:`GDNDetGrads` ``(dq, dk, dv, dg, dbeta, dinitial_state, dA_log, ddt_bias)``;
        with the in-kernel gate / beta sigmoid, dg and dbeta are w.r.t. the raw g and the
        pre-sigmoid beta, and dA_log / ddt_bias are sums over all tokens of all sequences in
        a fixed order (per-block partials, then the blocks in index order; no atomics).

    Raises:
        ValueError: a saved set of another type or mode, ``do``/``dht`` of the wrong shape,
            dtype or device, a foreign plan or workspace; before any launch.
    """
    return bwd_entry(DET, do, dht, saved, plan, workspace)


def bwd_entry(types: ModeTypes, do, dht, saved, plan, workspace) -> GDNDetGrads:
    """The body of :func:`chunk_gdn_det_bwd` with ``types`` (:class:`ModeTypes`): every
    check, then ``types.before_bwd`` (when set), then the launches."""
    require_mode(saved, types.saved, types.mode, name="saved")
    device = check_grad_outputs(do, dht, saved)
    plan, workspace = resolve_for_backward(
        saved, plan, workspace, device,
        resolve_plan=lambda *a: _resolve_plan(*a, types=types),
        resolve_workspace=lambda *a: _resolve_workspace(*a, types=types),
        chunk_size=CHUNK_SIZE)
    if types.before_bwd is not None:
        types.before_bwd()
    with torch.no_grad():
        return _launch_bwd(do, dht, saved, plan, workspace)


# ----------------------------------------------------------------------------- custom ops
# One autograd definition: under torch.compile the entry calls the fwd op, whose registered
# autograd saves what the backward needs and calls the bwd op; eagerly, an autograd.Function over
# the same bodies, setup_context and backward (cake_core.compile.eager_function). The plan crosses
# as its int fields; None-able tensors stay None; outputs that may not exist (final state, L2-norm
# rstds, the kept g_cumsum and states, gradients of absent inputs) are empty fp32 tensors ``[0]``.
# A (T) is always kept (the backward skips k k^T and the solve); g_cumsum, h, w and v_new only
# with plan.keep_states (h with max_chunks rows: its shape must follow from the inputs' shapes;
# the first NC rows are the states).


def _h_rows(NT: int, N: int) -> int:
    """Rows of the h the fwd op returns with ``plan.keep_states``: the most chunks N
    sequences of NT tokens can form (:func:`cake_gdn_det_train.saved.max_chunks`)."""
    return max_chunks(NT, N)


def _kept_shapes(plan: GDNDetPlan, NT: int, N: int, HV: int, K: int, V: int):
    """Shapes of the fwd op's kept ``(g_cumsum, h, w, v_new)``: ``[0]`` each without
    ``plan.keep_states``."""
    if not plan.keep_states:
        return ((0,),) * 4
    return (NT, HV), (_h_rows(NT, N), HV, K, V), (NT, HV, K), (NT, HV, V)


def _bwd_fake(do, dht, q, k, v, g, beta, initial_state, cu_seqlens, q_rstd, k_rstd, A_log,
              dt_bias, g_cumsum, A, h, w, v_new, scale, use_l2, use_gate, use_sigmoid,
              plan_fields):
    f32 = torch.float32
    HV = v.shape[2]
    dh0 = (initial_state.new_empty(initial_state.shape) if initial_state is not None
           else q.new_empty((0,), dtype=f32))
    dA = A_log.new_empty((HV,)) if use_gate else q.new_empty((0,), dtype=f32)
    ddt = dt_bias.new_empty((HV,)) if use_gate and dt_bias is not None else \
        q.new_empty((0,), dtype=f32)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            g.new_empty(g.shape), beta.new_empty(beta.shape), dh0, dA, ddt)


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, output_final_state,
     use_l2, use_gate, use_sigmoid, plan_fields) = inputs
    _, _, qn, kn, q_rstd, k_rstd, g_cumsum, A, h, w, v_new = output
    if use_l2:  # the backward needs the norm's outputs, not q and k
        q, k = qn, kn
    # no zero grads made for the outputs only the backward reads (memsets of A, states)
    ctx.set_materialize_grads(False)
    cu = autograd_cu_seqlens(cu_seqlens, q, CHUNK_SIZE)  # the forward's device offsets
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu, q_rstd, k_rstd, A_log, dt_bias,
                          g_cumsum, A, h, w, v_new)
    ctx.scale, ctx.output_final_state, ctx.use_l2 = scale, output_final_state, use_l2
    ctx.use_gate, ctx.use_sigmoid, ctx.plan_fields = use_gate, use_sigmoid, plan_fields


_EAGER: dict[str, type] = {}  # ops namespace -> its eager autograd.Function (define_ops)


def define_ops(types: ModeTypes):
    """Register the custom ops ``<types.ops>::fwd`` / ``::bwd`` and their autograd, the
    plan crossing as ``types.plan``'s fields and the backward's saved set a ``types.saved``
    (this package's ops at import: :data:`DET`; cake-gdn-nondet-train registers its own
    with its types). ``types.before_bwd`` runs first in the bwd op, before any launch.
    Returns ``(fwd_op, bwd_op)``."""

    def fwd_body(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, initial_state: torch.Tensor | None,
               cu_seqlens: torch.Tensor | None, A_log: torch.Tensor | None,
               dt_bias: torch.Tensor | None, scale: float, output_final_state: bool,
               use_l2: bool, use_gate: bool, use_sigmoid: int, plan_fields: list[int],
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                          torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                          torch.Tensor]:
        """``(o, final_state or [0], qn or [0], kn or [0], q_rstd or [0], k_rstd or [0],
        g_cumsum or [0], A, h or [0], w or [0], v_new or [0])`` (q and k L2-normalised with
        the norm); arguments checked by the entry, except the
        values of cu_seqlens (checked here, before any launch: a cache hit when the entry
        resolved them)."""
        plan = plan_from_op_fields(types.plan, plan_fields, types.mode)
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        seqs = resolve_chunks(cu_seqlens, B, T, q.device, CHUNK_SIZE)
        qc, kc, vc, gc, bc = (t.contiguous() for t in (q, k, v, g, beta))
        h0 = initial_state.contiguous() if initial_state is not None else None
        NT, N = B * T, seqs.num_seqs
        o, ht, (qn, kn, q_rstd, k_rstd, g_cumsum, A, states) = _launch_fwd(
            qc, kc, vc, gc, bc, float(scale), h0, output_final_state, use_l2, plan, None,
            seqs.tables, _gate_args(use_gate, A_log, dt_bias, use_sigmoid),
            h_rows=_h_rows(NT, N))
        if kn is not None and kn is qn:  # q is k: an op's outputs may not alias
            kn, k_rstd = kn.clone(), k_rstd.clone()
        if plan.keep_states:
            if states is None:  # no tokens: empty tensors of the shapes the fake gives
                states = tuple(q.new_empty(shape, dtype=A.dtype)
                               for shape in _kept_shapes(plan, NT, N, HV, K, V)[1:])
            h, w, v_new = states
        else:
            g_cumsum = h = w = v_new = None
        return (o, *(optional_output(t, q) for t in (ht, qn, kn, q_rstd, k_rstd, g_cumsum)), A,
                *(optional_output(t, q) for t in (h, w, v_new)))

    fwd_op = torch.library.custom_op(f"{types.ops}::fwd", mutates_args=())(fwd_body)

    @fwd_op.register_fake
    def _fwd_fake(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale,
                  output_final_state, use_l2, use_gate, use_sigmoid, plan_fields):
        plan = plan_from_op_fields(types.plan, plan_fields, types.mode)
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        NT = B * T
        f32 = torch.float32
        idt = inter_dtype(plan, q.dtype)
        ht = q.new_empty((N, HV, K, V) if output_final_state else (0,), dtype=f32)
        rstd = (B, T, H) if use_l2 else (0,)
        qk = (B, T, H, K) if use_l2 else (0,)
        if plan.keep_states:  # the most chunks N sequences of NT tokens can form
            nh = _h_rows(NT, N)
            kept = ((NT, HV), (nh, HV, K, V), (NT, HV, K), (NT, HV, V))
        else:
            kept = ((0,),) * 4
        return (q.new_empty((B, T, HV, V), dtype=v.dtype), ht, q.new_empty(qk),
                k.new_empty(qk), q.new_empty(rstd, dtype=f32), q.new_empty(rstd, dtype=f32),
                q.new_empty(kept[0], dtype=f32),
                q.new_empty((NT, HV, CHUNK_SIZE), dtype=idt),
                *(q.new_empty(shape, dtype=idt if plan.keep_states else f32)
                  for shape in kept[1:]))

    def bwd_body(do: torch.Tensor, dht: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
               q_rstd: torch.Tensor | None, k_rstd: torch.Tensor | None,
               A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
               g_cumsum: torch.Tensor, A: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
               v_new: torch.Tensor, scale: float, use_l2: bool, use_gate: bool,
               use_sigmoid: int, plan_fields: list[int],
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                          torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dq, dk, dv, dg, dbeta, dinitial_state or [0], dA_log or [0], ddt_bias or
        [0])``: :func:`_launch_bwd` on a saved set rebuilt from the arguments (q and k
        L2-normalised with ``use_l2``; the fwd op's kept tensors: ``[0]`` ones are absent).
        ``cu_seqlens``: the forward's device offsets (:attr:`cake_core.varlen.SeqChunks.cu`,
        resolved to the forward's tables: a cache hit) or the caller's tensor (traced)."""
        if types.before_bwd is not None:
            types.before_bwd()
        plan = plan_from_op_fields(types.plan, plan_fields, types.mode)
        B, T = q.shape[:2]
        seqs = resolve_chunks(cu_seqlens, B, T, q.device, CHUNK_SIZE)
        kept = [t if t.numel() else None for t in (g_cumsum, h, w, v_new)]
        saved = _saved_set(q, k, v, g, beta, kept[0], A, initial_state, seqs,
                           q_rstd if use_l2 else None, k_rstd if use_l2 else None,
                           A_log if use_gate else None, dt_bias if use_gate else None,
                           float(scale), use_l2, plan, cu_seqlens is not None, use_gate,
                           use_sigmoid, types=types,
                           states=tuple(kept[1:]) if kept[1] is not None else None)
        gr = _launch_bwd(do, dht, saved, plan, None)
        return (gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, optional_output(gr.dinitial_state, q),
                optional_output(gr.dA_log, q), optional_output(gr.ddt_bias, q))

    bwd_op = torch.library.custom_op(f"{types.ops}::bwd", mutates_args=())(bwd_body)
    bwd_op.register_fake(_bwd_fake)

    def backward(ctx, do, dht, *_, bwd=bwd_op):
        (q, k, v, g, beta, h0, cu, q_rstd, k_rstd, A_log, dt_bias, g_cumsum, A, h, w,
         v_new) = ctx.saved_tensors
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias = bwd(
            do, dht if ctx.output_final_state else None, q, k, v, g, beta, h0, cu, q_rstd,
            k_rstd, A_log, dt_bias, g_cumsum, A, h, w, v_new, ctx.scale, ctx.use_l2,
            ctx.use_gate, ctx.use_sigmoid, ctx.plan_fields)
        need = ctx.needs_input_grad
        return (dq, dk, dv, dg, dbeta, dh0 if h0 is not None and need[5] else None, None,
                dA_log if A_log is not None and ctx.use_gate and need[7] else None,
                ddt_bias if dt_bias is not None and ctx.use_gate and need[8] else None,
                None, None, None, None, None, None)

    # not twice differentiable: a second differentiation raises (cake_core.autograd)
    # the registered op (traced by torch.compile); eagerly below, its body
    fwd_op.register_autograd(once_differentiable(backward), setup_context=_setup_context)
    _EAGER[types.ops] = eager_function(
        f"_ChunkGDN{types.mode.value.capitalize()}Function", fwd_body, _setup_context,
        once_differentiable(lambda ctx, *grads: backward(ctx, *grads, bwd=bwd_body)))
    return fwd_op, bwd_op


_fwd_op, _bwd_op = define_ops(DET)


#: FLA ``chunk_gated_delta_rule`` keywords taken for compatibility (cake_core.linear_attention).
_FLA_KEYWORDS = ("cu_seqlens_cpu", "chunk_indices", "disable_recompute", "chunk_size",
                 "state_v_first", "transpose_state_layout", "head_first", "cp_context")


def chunk_gated_delta_rule_det(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               g: torch.Tensor, beta: torch.Tensor, scale: float | None = None,
                               initial_state: torch.Tensor | None = None,
                               output_final_state: bool = False,
                               use_qk_l2norm_in_kernel: bool = False,
                               cu_seqlens: torch.Tensor | None = None, *,
                               plan: GDNDetPlan | None = None,
                               use_gate_in_kernel: bool = False,
                               A_log: torch.Tensor | None = None,
                               dt_bias: torch.Tensor | None = None,
                               use_beta_sigmoid_in_kernel: bool = False,
                               allow_neg_eigval: bool = False, **fla_kwargs):
    """Deterministic drop-in for FLA's ``chunk_gated_delta_rule``, with autograd.

    Arguments, shapes and errors as :func:`chunk_gdn_det_fwd` (including FLA's
    ``use_gate_in_kernel``, ``A_log``, ``dt_bias``, ``use_beta_sigmoid_in_kernel`` and
    ``allow_neg_eigval``: beta' = 2 * sigmoid(beta), with the sigmoid). The first nine
    positional arguments are FLA's; the 10th is ``cu_seqlens`` (FLA's is
    ``use_beta_sigmoid_in_kernel``: pass FLA's flags by keyword; a bool there raises
    ``ValueError``). FLA's other keywords are accepted for drop-in calls: the speed hints
    ``cu_seqlens_cpu`` and ``chunk_indices`` (ignored: cake reads ``cu_seqlens`` and builds
    its chunk tables itself), ``disable_recompute`` (below), and ``chunk_size=64``,
    ``state_v_first=False``, ``transpose_state_layout=False``, ``head_first=False``,
    ``cp_context=None`` (FLA's defaults; another value raises ``ValueError``; context
    parallelism is ``cake-gdn-det-train-kcp``). Unlike :func:`chunk_gdn_det_fwd`, and as
    FLA, a bf16 / fp16 ``initial_state`` is taken (upcast to fp32 first; its gradient comes
    back in its dtype).
    Returns ``(o, final_state)`` (``final_state`` is ``None`` without
    ``output_final_state``). Gradients flow to q, k, v, g, beta, initial_state, A_log and
    dt_bias (through :func:`chunk_gdn_det_bwd`); bitwise repeatable for equal inputs,
    upstream gradients, plan and hardware; not twice differentiable.

    ``disable_recompute`` (FLA's flag, tested by truthiness as FLA does; default off): on,
    the forward keeps the chunk states (h, w, v_new and g's cumulative sum) for the
    backward, which skips their recompute: less time for more memory (:func:`saved_bytes`
    counts it), the same bits. Without a ``plan`` the call runs the plan it picks anyway
    with ``keep_states = 1``; with a ``plan``, that plan must have ``keep_states = 1``
    (else ``ValueError`` before any launch: pass ``dataclasses.replace(plan,
    keep_states=1)`` or drop ``disable_recompute``). A value without a truth value (an
    array of several elements) raises ``ValueError``.

    Under ``torch.compile`` (``fullgraph=True`` works) the call is the custom ops
    ``cake_gdn_det_train::fwd`` / ``::bwd`` (the plan passed by its fields) with their registered
    autograd; eagerly, the same op bodies and autograd formula as an ``autograd.Function``
    (no dispatcher overhead): the same launches, the same bits. While traced, the
    values of ``cu_seqlens`` are checked when the op runs.
    """
    return autograd_entry(DET, "chunk_gated_delta_rule_det", q, k, v, g, beta, scale,
                          initial_state, output_final_state, use_qk_l2norm_in_kernel,
                          cu_seqlens, plan, use_gate_in_kernel, A_log, dt_bias,
                          use_beta_sigmoid_in_kernel, allow_neg_eigval, fla_kwargs)


def autograd_entry(types: ModeTypes, entry: str, q, k, v, g, beta, scale, initial_state,
                   output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, plan,
                   use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                   allow_neg_eigval, fla_kwargs):
    """The body of :func:`chunk_gated_delta_rule_det` (named ``entry`` in messages) with
    ``types``: its plans and its custom ops ``<types.ops>::fwd`` / ``::bwd``."""
    initial_state, (_, _, scale, A_log, dt_bias, sig, plan, _) = entry_checks(
        types, entry, q, k, v, g, beta, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, plan, use_gate_in_kernel, A_log, dt_bias,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, fla_kwargs)
    # eagerly the ops' own body and autograd without the dispatcher's Python (host time)
    call = getattr(torch.ops, types.ops).fwd if torch.compiler.is_compiling() else \
        _EAGER[types.ops].apply
    o, ht, *_ = call(
        q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, scale, output_final_state,
        use_qk_l2norm_in_kernel, use_gate_in_kernel, sig,
        plan_to_op_fields(plan))
    return o, (ht if output_final_state else None)


def entry_checks(types: ModeTypes, entry: str, q, k, v, g, beta, scale, initial_state,
                 output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, plan,
                 use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                 allow_neg_eigval, fla_kwargs, *, convert_state: bool = True):
    """Every check of the autograd entry (``entry`` in messages), in its order: FLA's
    keywords, then :func:`_check_inputs` with a bf16 / fp16 ``initial_state`` taken as fp32.
    Returns ``(initial_state, _check_inputs's tuple)``: the state the entry runs with (an
    fp32 copy of a 16-bit one when ``convert_state``; without it, an fp32 stand-in of its
    shape, for checks that must not copy)."""
    check_fla_compat(fla_kwargs, entry, _FLA_KEYWORDS)
    keep = bool(fla_kwargs.get("disable_recompute", False))  # by truthiness, as FLA
    if isinstance(initial_state, torch.Tensor) and \
            initial_state.dtype in (torch.bfloat16, torch.float16):
        # as FLA, which loads the state as fp32
        initial_state = initial_state.float() if convert_state else \
            initial_state.new_empty((), dtype=torch.float32).expand(initial_state.shape)
    return initial_state, _check_inputs(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        cu_seqlens, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, plan, types, disable_recompute=keep)
