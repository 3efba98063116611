"""Launches of the KDA chunk kernels: the forward and backward of the chunked recurrence.

The entry points (:mod:`cake_kda_det_train.api`) check inputs, apply the L2 norm and the
in-kernel gate, then call :func:`kda_chunk_fwd` / :func:`kda_chunk_bwd`. Here, tensors are
already checked and contiguous; the math is in kernels/chunk_fwd.py and chunk_bwd.py.
"""

from __future__ import annotations

import torch
import triton.language as tl
from cake_core.chunk_output import chunk_output
from cake_core.chunk_state import chunk_state_bwd, chunk_state_fwd
from cake_core.gemm import direct_store_dtype, group_sum_cast
from cake_core.l2norm import l2norm_bwd
from cake_core.triton_utils import is_interpreting, next_power_of_2

from cake_kda_det_train.kernels.chunk_bwd import (
    kda_bwd_dg_cumsum_kernel,
    kda_bwd_intra_kernel,
    kda_bwd_intra_tok_kernel,
    kda_bwd_local_kernel,
)
from cake_kda_det_train.kernels.chunk_fwd import (
    kda_chunk_cumsum_kernel,
    kda_fwd_inv_kernel,
    kda_fwd_pairs_kernel,
    kda_fwd_pairs_tok_kernel,
    kda_fwd_prep_kernel,
)
from cake_kda_det_train.kernels.gate import SOFTPLUS_THRESHOLD
from cake_kda_det_train.plan import CHUNK_SIZE, SUB_CHUNK, KDADetPlan, inter_dtype

#: ``maxnreg`` of the backward chunk kernel's launch (the PTX ``.maxnreg``: registers per
#: thread ptxas may use), or ``None``: ptxas decides (the rule). A cap gave the same bits and
#: no gain (255) or a slower kernel (168, 128; measurements: docs/benchmarks/kda.md), so it
#: stays a launch constant for sweeps (``chunk.BWD_MAXNREG=255``), None in the rule. The
#: interpreter ignores it.
BWD_MAXNREG = None

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_dtype(plan: KDADetPlan, dtype: torch.dtype):
    """``DT`` of the kernels: the intermediates' dtype on CUDA, fp32 under the interpreter
    (its bf16 ``tl.dot`` is wrong in Triton 3.6)."""
    return tl.float32 if is_interpreting() else _TL[inter_dtype(plan, dtype)]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scratch(workspace, NT: int, NC: int, HV: int, K: int, V: int, dev, idt,
             keep: bool = False, h_rows: int | None = None):
    """w, u, v_new ``[NT, HV, *]``, h ``[NC, HV, K, V]``, aqk ``[NT, HV, 64]``: views of
    the workspace's leading rows, or fresh tensors. ``keep``: w, v_new and h are always
    fresh (a saved set keeps them past the call; a later call would overwrite a
    workspace's), h with ``h_rows`` rows when given (>= NC; the kernels use the first NC)."""
    def fresh(*shape):
        return torch.empty(shape, dtype=idt, device=dev)

    if workspace is None:
        return (fresh(NT, HV, K), fresh(NT, HV, V), fresh(NT, HV, V),
                fresh(NC if h_rows is None else h_rows, HV, K, V), fresh(NT, HV, CHUNK_SIZE))
    if keep:
        return (fresh(NT, HV, K), workspace["u"][:NT], fresh(NT, HV, V),
                fresh(NC if h_rows is None else h_rows, HV, K, V), workspace["aqk"][:NT])
    return (workspace["w"][:NT], workspace["u"][:NT], workspace["v_new"][:NT],
            workspace["h"][:NC], workspace["aqk"][:NT])


def kept_a_shape(NT: int, HV: int) -> tuple[int, ...]:
    """Shape of the A a forward returns (and a backward loads): T and Aqk stacked,
    ``[2, NT, HV, 64]``."""
    return (2, NT, HV, CHUNK_SIZE)


def _consts(plan: KDADetPlan, dtype: torch.dtype) -> dict:
    return dict(DT=_dot_dtype(plan, dtype), PREC=plan.dot_precision, BT=CHUNK_SIZE,
                BK=plan.block_k)


def _prep_and_state(q, k, v, beta, scale, initial_state, ht, plan, tabs, g_cumsum, A,
                    scratch, load_a: bool):
    """The chunk quantities (T, w, u, Aqk, kg) from G (``g_cumsum``, formed first) and the
    state recurrence (h, v_new, final state). With ``load_a`` (the backward given the
    forward's T and Aqk) ``A`` is that T and scratch's aqk that Aqk: neither the pairs nor
    the inverse kernel runs. Returns kg ``[B * T, HV, K]`` (k exp(G_last - G) in the
    intermediates' dtype, a scratch of this call, not of the workspace)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    starts, ends, chunk_off, cu_dev, NC = tabs
    w, u, v_new, h, aqk = scratch
    cst = _consts(plan, q.dtype)
    if not load_a:  # the pair products per sub-chunk, the diagonal blocks per token, then T
        akks = torch.empty((B * T, HV, CHUNK_SIZE), dtype=torch.float32, device=q.device)
        kda_fwd_pairs_kernel[(NC * (CHUNK_SIZE // SUB_CHUNK), HV)](
            q, k, g_cumsum, starts, ends, akks, aqk, scale, H, HV, HV // H, K,
            BC=SUB_CHUNK, BKI=plan.block_k_inner, num_warps=4, DT=cst["DT"],
            PREC=cst["PREC"], BT=CHUNK_SIZE)
        kda_fwd_pairs_tok_kernel[(NC * CHUNK_SIZE, _cdiv(HV, plan.tok_heads))](
            q, k, g_cumsum, starts, ends, akks, aqk, scale, H, HV, HV // H, K,
            BT=CHUNK_SIZE, BC=SUB_CHUNK, BKF=next_power_of_2(max(16, K)),
            BH=plan.tok_heads, num_warps=plan.num_warps_tok)
        kda_fwd_inv_kernel[(NC, HV)](
            akks, beta, starts, ends, A, HV, PREC=cst["PREC"], BT=CHUNK_SIZE, BC=SUB_CHUNK,
            LOG2_BC=SUB_CHUNK.bit_length() - 1, num_warps=2)
    kg = torch.empty((B * T, HV, K), dtype=w.dtype, device=q.device)
    kda_fwd_prep_kernel[(NC, HV)](
        k, v, g_cumsum, beta, starts, ends, A, w, u, kg, H, HV, HV // H, K, V,
        BKI=plan.block_k_inner, BVF=next_power_of_2(max(16, V)),
        num_warps=plan.num_warps_prep, DT=cst["DT"], PREC=cst["PREC"], BT=CHUNK_SIZE)
    chunk_state_fwd(kg, w, u, g_cumsum, cu_dev, chunk_off, initial_state, h, v_new, ht,
                    H=H, HV=HV, K=K, V=V, dot_dtype=cst["DT"], precision=cst["PREC"],
                    block_k=plan.block_k, block_v=plan.block_v_h, per_channel=True,
                    num_warps=plan.num_warps_h, num_stages=plan.num_stages_h,
                    chunk_size=CHUNK_SIZE)
    return kg


def g_cumsum_into(out, g, starts, ends, NC: int, plan: KDADetPlan, gate=None):
    """``out`` (fp32 ``[NT, HV, K]``) = each chunk's cumulative sum over its tokens of the
    per-token log decay: of g itself, or with ``gate = (A_log, dt_bias, lower_bound)`` of
    FLA's in-kernel gate of the raw g (kernels/gate.py's formulas), applied as the sums
    are formed. ``starts`` / ``ends``: the ``NC`` chunks' token ranges (at most
    ``CHUNK_SIZE`` tokens each), ``NC > 0``."""
    HV, K = out.shape[1], out.shape[2]
    A_log, dt_bias, lower_bound = gate if gate is not None else (None, None, None)
    kda_chunk_cumsum_kernel[(NC, HV)](
        g, out, starts, ends, A_log if A_log is not None else g,
        dt_bias if dt_bias is not None else g,
        lower_bound if lower_bound is not None else 0.0, HV, K, BT=CHUNK_SIZE,
        BKI=plan.block_k_inner, GATE=gate is not None, HAS_A=A_log is not None,
        HAS_BIAS=dt_bias is not None, LOWER_BOUND=lower_bound is not None,
        THRESHOLD=SOFTPLUS_THRESHOLD, num_warps=4)


def kda_chunk_fwd(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool,
                  tabs: tuple, plan: KDADetPlan, workspace=None, gate=None,
                  h_rows: int | None = None):
    """The chunked KDA forward on checked, contiguous tensors.

    Args:
        q, k: ``[B, T, H, K]`` (already L2-normalised when asked). v: ``[B, T, HV, V]``.
        g: ``[B, T, HV, K]`` per-token log decay, fp32 or q's dtype; the raw g when
            ``gate`` is given.
        beta: ``[B, T, HV]`` (after any sigmoid). scale: float.
        initial_state: fp32 ``[N, HV, K, V]`` or None. output_final_state: bool.
        tabs: the chunk tables ``(starts, ends, chunk_off, cu, NC)`` of the sequences in the
            ``B * T`` tokens on q's device
            (:attr:`cake_core.varlen.SeqChunks.tables`; read-only).
        plan: a :class:`KDADetPlan`. workspace: a checked KDADetWorkspace or None.
        gate: ``(A_log, dt_bias, lower_bound)`` (contiguous tensors or None, a float or
            None): FLA's in-kernel gate, applied to g as the chunk cumulative sums are
            formed (kernels/gate.py's math); None: g is the log decay itself.
        h_rows: with ``plan.keep_states``, the rows of the kept h (>= the chunk count;
            default the chunk count).

    Returns:
        ``(o, final_state, g_cumsum, A, states)``: o ``[B, T, HV, V]`` in v's dtype; final_state
        fp32 ``[N, HV, K, V]`` or None; g_cumsum fp32 ``[B * T, HV, K]`` (within-chunk
        cumulative decays); A ``[B * T, HV, 64]`` each chunk's T = (I + A)^-1 in
        :func:`cake_kda_det_train.plan.inter_dtype` stacked with each chunk's gated ``scale
        q k^T``: ``[2, B * T, HV, 64]``; states: with ``plan.keep_states`` and at least
        one token ``(h, w, kg, v_new)`` in fresh tensors (the chunk states ``[h_rows, HV,
        K, V]``, ``[B * T, HV, K]`` twice, ``[B * T, HV, V]``, intermediates' dtype), else
        None.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, N = B * T, tabs[3].numel() - 1
    dev = q.device
    idt = inter_dtype(plan, q.dtype)
    NC = tabs[4]
    g_cumsum = torch.empty((NT, HV, K), dtype=torch.float32, device=dev)
    if NC:  # G first: the GPU starts before the host's other allocations
        g_cumsum_into(g_cumsum, g, tabs[0], tabs[1], NC, plan, gate)
    o = torch.empty((B, T, HV, V), dtype=v.dtype, device=dev)
    # T and Aqk stacked, both returned for the backward
    A = torch.empty(kept_a_shape(NT, HV), dtype=idt, device=dev)
    ht = torch.empty((N, HV, K, V), dtype=torch.float32, device=dev) \
        if output_final_state else None
    if NC == 0:  # no tokens: every final state is its initial state
        if ht is not None:
            if initial_state is not None:
                ht.copy_(initial_state)
            else:
                ht.zero_()
        return o, ht, g_cumsum, A, None
    keep = bool(plan.keep_states)
    scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt, keep, h_rows)
    scratch = (*scratch[:4], A[1])  # Aqk into the returned stack, not the workspace
    kg = _prep_and_state(q, k, v, beta, scale, initial_state, ht, plan, tabs, g_cumsum, A[0],
                         scratch, load_a=False)
    w, _, v_new, h, aqk = scratch
    cst = _consts(plan, q.dtype)
    chunk_output(q, None, g_cumsum, aqk, v_new, h, tabs[0], tabs[1], o, scale, chunks=NC, H=H,
                 HV=HV, K=K, V=V, dot_dtype=cst["DT"], precision=cst["PREC"],
                 block_k=plan.block_k, block_v=plan.block_v, per_channel=True,
                 num_warps=plan.num_warps_o, chunk_size=CHUNK_SIZE)
    return o, ht, g_cumsum, A, (h, w, kg, v_new) if keep else None


def dg_cumsum_into(out, dG, starts, ends, NC: int, plan: KDADetPlan, gate=None):
    """``out`` (``[NT, HV, K]``, any float dtype; may be ``dG`` itself) = each chunk's
    reverse cumulative sum of the fp32 ``dG`` over its tokens: the gradient w.r.t. the
    per-token log decay; with ``gate = (g, A_log, dt_bias, lower_bound)`` (g the raw g)
    through FLA's in-kernel gate's backward: the gradient w.r.t. the raw g. Returns the
    per-chunk fp32 partial sums ``(dA_log [NC, HV], ddt_bias [NC, HV * K])`` (``None``
    where there is no such parameter), to be added in chunk order. ``starts`` /
    ``ends``: the ``NC > 0`` chunks' token ranges (at most ``CHUNK_SIZE`` tokens each)."""
    HV, K = dG.shape[-2], dG.shape[-1]
    g, A_log, dt_bias, lower_bound = gate if gate is not None else (None, None, None, None)
    f32 = torch.float32
    da = torch.empty((NC, HV), dtype=f32, device=dG.device) if A_log is not None else None
    db = torch.empty((NC, HV * K), dtype=f32, device=dG.device) \
        if dt_bias is not None else None
    kda_bwd_dg_cumsum_kernel[(NC, HV)](
        dG, out, g if g is not None else dG, A_log if A_log is not None else dG,
        dt_bias if dt_bias is not None else dG, da if da is not None else dG,
        db if db is not None else dG, lower_bound if lower_bound is not None else 0.0,
        starts, ends, HV, K, BT=CHUNK_SIZE, BKI=plan.block_k_inner, GATE=gate is not None,
        HAS_A=A_log is not None, HAS_BIAS=dt_bias is not None,
        LOWER_BOUND=lower_bound is not None, THRESHOLD=SOFTPLUS_THRESHOLD, num_warps=4)
    return da, db


def kda_chunk_bwd(do, dht, q, k, v, g_cumsum, beta, A, scale: float, initial_state,
                  tabs: tuple, plan: KDADetPlan, workspace=None,
                  grad_dtype: torch.dtype = torch.float32, gate=None,
                  dg_dtype: torch.dtype = torch.float32, l2norm=None, states=None):
    """Backward of :func:`kda_chunk_fwd`: recomputes the chunk quantities from the saved
    g_cumsum (and T when ``A`` is given and matches the plan), runs the state-gradient
    recurrence in reverse, then the chunk-local gradients.

    Args:
        do: ``[B, T, HV, V]``. dht: fp32 ``[N, HV, K, V]`` or None (zero).
        q, k, v, beta, initial_state, tabs, scale: as given to the forward.
        g_cumsum: the forward's. A: the forward's ``[2, B * T, HV, 64]`` stack of T and
            Aqk, or None (recomputed).
        grad_dtype: the dtype of the returned dq and dk (the cast is fused into the
            value-head sum, or into the L2 norm's backward).
        gate: ``(g, A_log, dt_bias, lower_bound)`` with FLA's in-kernel gate (g raw), or
            None. dg_dtype: the dtype dg is stored in (g's, cast in the kernel).
        l2norm: ``(q_rstd, k_rstd)`` when q and k (given normalised) came from the q/k L2
            norm (:func:`cake_core.l2norm.l2norm_fwd`): dq, dk are then w.r.t. the raw
            inputs (the norm's backward needs only its outputs: the given q and k, and the
            rstds). With one value head per q/k head it runs in the last kernel on the
            whole rows it holds; with more, on the fp32 value-head sums, one cake-core
            launch each.
        states: the forward's kept ``(h, w, kg, v_new)`` (``plan.keep_states``; h may have
            more rows than chunks), checked by the caller to fit this call: with ``A``
            loadable the chunk prep and the forward state pass are skipped (same bits).

    Returns:
        ``(dq, dk, dv, dg, dbeta, dh0, dA_log_parts, ddt_bias_parts)``: dq, dk
        ``grad_dtype`` ``[B, T, H, K]`` (value heads of one q/k head added in index order in
        fp32, cast once); dv ``[B, T, HV, V]`` of
        :func:`cake_core.gemm.direct_store_dtype` of v's dtype; dg ``[B, T, HV, K]`` of
        ``direct_store_dtype(dg_dtype)`` w.r.t. the per-token log decay (the raw g with
        ``gate``); dbeta fp32 ``[B, T, HV]``; dh0 fp32 ``[N, HV, K, V]``, or None without
        an initial state; the per-chunk partial sums of :func:`dg_cumsum_into` (``None``
        without ``gate`` or its parameter; zero rows with no tokens).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, N = B * T, tabs[3].numel() - 1
    dev = q.device
    f32 = torch.float32
    # the L2 norm's backward in the token kernel where its rows of dq, dk are whole (one
    # value head per q/k head); else after the value-head sums, which then stay fp32
    l2_in_kernel = l2norm is not None and HV == H
    sum_dtype = f32 if l2norm is not None and not l2_in_kernel else grad_dtype
    idt = inter_dtype(plan, q.dtype)
    NC = tabs[4]
    dq_hv = torch.empty((NT, HV, K), dtype=f32, device=dev)
    dk_hv = torch.empty((NT, HV, K), dtype=f32, device=dev)
    # with one value head per q/k head, the token-parallel kernel (the last to add to dq and
    # dk) stores them in grad_dtype itself: no value-head sum, no cast pass (two
    # elementwise passes fewer in the backward). The same bits: a sum
    # of one term is the term and both casts round to nearest even (under the interpreter
    # bf16 stays fp32 and torch casts, as group_sum_cast does there)
    direct = HV == H
    odt = direct_store_dtype(sum_dtype) if direct else f32
    dq_out, dk_out = (dq_hv, dk_hv) if odt == f32 else (
        torch.empty((NT, HV, K), dtype=odt, device=dev),
        torch.empty((NT, HV, K), dtype=odt, device=dev))
    # stored once: the kernel writes v's dtype (fp32 under the interpreter for bf16, whose
    # in-kernel bf16 cast truncates; the caller's cast rounds to nearest even)
    dv = torch.empty((B, T, HV, V), dtype=direct_store_dtype(v.dtype), device=dev)
    dg = torch.empty((B, T, HV, K), dtype=f32, device=dev)
    dgo = dg if direct_store_dtype(dg_dtype) == f32 else torch.empty(
        (B, T, HV, K), dtype=direct_store_dtype(dg_dtype), device=dev)
    parts = (None, None)
    dbeta = torch.empty((B, T, HV), dtype=f32, device=dev)
    dh0 = torch.empty((N, HV, K, V), dtype=f32, device=dev) \
        if initial_state is not None else None
    if NC == 0:
        if dh0 is not None:
            if dht is not None:
                dh0.copy_(dht)
            else:
                dh0.zero_()
    else:
        load_a = A is not None and A.dtype == idt and tuple(A.shape) == kept_a_shape(NT, HV)
        g_cs = g_cumsum
        if load_a and states is not None:  # the forward's: no prep, no forward state pass
            h, w, kg, v_new = states
            A, aqk = A[0], A[1]
        else:
            scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt)
            if load_a:  # T and the forward's Aqk: neither the pairs nor the inverse kernel
                scratch = (*scratch[:4], A[1])
                A = A[0]
            else:
                A = torch.empty((NT, HV, CHUNK_SIZE), dtype=idt, device=dev)
            kg = _prep_and_state(q, k, v, beta, scale, initial_state, None, plan, tabs, g_cs,
                                 A, scratch, load_a=load_a)
            w, _, v_new, h, aqk = scratch
        cst = _consts(plan, q.dtype)
        dh = torch.empty((NC, HV, K, V), dtype=idt, device=dev)
        du = torch.empty((NT, HV, V), dtype=idt, device=dev)
        dht_c = dht.contiguous() if dht is not None else None
        chunk_state_bwd(q, kg, w, g_cs, aqk, do, tabs[3], tabs[2], dht_c, dh, du, dh0, scale,
                        H=H, HV=HV, K=K, V=V, dot_dtype=cst["DT"], precision=cst["PREC"],
                        block_k=plan.block_k, block_v=plan.block_v_h, per_channel=True,
                        num_warps=plan.num_warps_dh, num_stages=plan.num_stages_dh,
                        chunk_size=CHUNK_SIZE)
        # fp32 copies of each chunk's dA and gated dAqk (FLA keeps the same two [T, 64]
        # matrices), read back by the sub-chunk and token-parallel kernels
        pscr = torch.empty((NT, HV, 2 * CHUNK_SIZE), dtype=f32, device=dev)
        kda_bwd_local_kernel[(NC, HV)](
            q, k, v, beta, g_cs, A, h, dh, do, v_new, du, tabs[0], tabs[1],
            dq_hv, dk_hv, dv, dg, dbeta, pscr,
            scale, H, HV, HV // H, K, V,
            BC=SUB_CHUNK, BKI=plan.block_k_bwd, BV=plan.block_v_bwd,
            NV=_cdiv(V, plan.block_v_bwd), num_warps=plan.num_warps_bwd, DT=cst["DT"],
            PREC=cst["PREC"], BT=CHUNK_SIZE,
            **({"maxnreg": BWD_MAXNREG} if BWD_MAXNREG else {}))
        # step 3 per 16-token sub-chunk, the terms inside each sub-chunk token-parallel,
        # then dg's reverse cumsum per chunk
        kda_bwd_intra_kernel[(NC * (CHUNK_SIZE // SUB_CHUNK), HV)](
            q, k, beta, g_cs, pscr, tabs[0], tabs[1], dq_hv, dk_hv, dg, dbeta,
            H, HV, HV // H, K,
            BC=SUB_CHUNK, BKI=plan.block_k_inner, num_warps=4,
            DT=cst["DT"], PREC=cst["PREC"], BT=CHUNK_SIZE)
        rq, rk = l2norm if l2_in_kernel else (dbeta, dbeta)
        kda_bwd_intra_tok_kernel[(NC * CHUNK_SIZE, _cdiv(HV, plan.tok_heads_bwd))](
            q, k, beta, g_cs, pscr, tabs[0], tabs[1], dq_hv, dk_hv, dg, dbeta,
            dq_out, dk_out, rq, rk, H, HV, HV // H, K, BT=CHUNK_SIZE, BC=SUB_CHUNK,
            BKF=next_power_of_2(max(16, K)), BH=plan.tok_heads_bwd, L2=l2_in_kernel,
            num_warps=plan.num_warps_tok_bwd)
        parts = dg_cumsum_into(dgo, dg, tabs[0], tabs[1], NC, plan, gate)
    # the fixed-order sum over each q/k head's value heads, fused with the cast
    if direct:  # stored by the token-parallel kernel (fp32 under the interpreter: cast here)
        dq = dq_out.view(B, T, H, K).to(sum_dtype)
        dk = dk_out.view(B, T, H, K).to(sum_dtype)
    else:
        dq = group_sum_cast(dq_hv, H, sum_dtype).view(B, T, H, K)
        dk = group_sum_cast(dk_hv, H, sum_dtype).view(B, T, H, K)
    if l2norm is not None and not l2_in_kernel:  # one launch each, dx in grad_dtype
        rq, rk = l2norm
        dq = _l2norm_bwd(q, rq, dq, plan, grad_dtype)
        dk = _l2norm_bwd(k, rk, dk, plan, grad_dtype)
    return dq, dk, dv, dgo, dbeta, dh0, *parts


def _l2norm_bwd(y, rstd, dy, plan: KDADetPlan, out_dtype: torch.dtype):
    """The q/k L2 norm's backward from its outputs y, rstd (cake-core's kernel with the
    forward's launch fields)."""
    return l2norm_bwd(y, rstd, dy, block_rows=plan.l2norm_block_rows, block_k=plan.block_k,
                      num_warps=4, out_dtype=out_dtype)
