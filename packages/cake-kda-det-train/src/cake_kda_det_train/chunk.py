"""Launches of the KDA chunk kernels: the forward and backward of the chunked recurrence.

The entry points (:mod:`cake_kda_det_train.api`) check inputs, apply the L2 norm and the
in-kernel gate, then call :func:`kda_chunk_fwd` / :func:`kda_chunk_bwd`. Here, tensors are
already checked and contiguous; the math is in kernels/chunk_fwd.py and chunk_bwd.py.
"""

from __future__ import annotations

import torch
import triton.language as tl
from cake_core.gemm import direct_store_dtype, group_sum_cast
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
    kda_fwd_o_kernel,
    kda_fwd_pairs_kernel,
    kda_fwd_pairs_tok_kernel,
    kda_fwd_prep_kernel,
)
from cake_kda_det_train.kernels.rec_op import kda_bwd_dh_op_kernel, kda_fwd_h_op_kernel
from cake_kda_det_train.plan import CHUNK_SIZE, SUB_CHUNK, KDADetPlan, inter_dtype

#: ``maxnreg`` of the backward chunk kernel's launch (the PTX ``.maxnreg``: registers per
#: thread ptxas may use), or ``None``: ptxas decides (the rule). Offline sm_90 builds of the
#: rule's 2-warp kernel at K = V = 128 (Triton 3.6, 2026-12-03): ptxas chose 32 registers
#: and 7680 stack bytes per thread (11186 spill instructions); with 255, 255 and 4008
#: (2950). Timed on an H200 at case b (session 25, 2026-12-03, ``shared/gpu/state_sweep.py``):
#: the same bits at 255 / 168 / 128, kernel 3225 us (rule) against 3238 / 4585 / 5355: no
#: gain, so it stays a launch constant for sweeps (``chunk.BWD_MAXNREG=255``), None in the
#: rule. The interpreter ignores it.
BWD_MAXNREG = None

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_dtype(plan: KDADetPlan, dtype: torch.dtype):
    """``DT`` of the kernels: the intermediates' dtype on CUDA, fp32 under the interpreter
    (its bf16 ``tl.dot`` is wrong in Triton 3.6)."""
    return tl.float32 if is_interpreting() else _TL[inter_dtype(plan, dtype)]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scratch(workspace, NT: int, NC: int, HV: int, K: int, V: int, dev, idt):
    """w, u, v_new ``[NT, HV, *]``, h ``[NC, HV, K, V]``, aqk ``[NT, HV, 64]``: views of
    the workspace's leading rows, or fresh tensors."""
    if workspace is None:
        return (torch.empty((NT, HV, K), dtype=idt, device=dev),
                torch.empty((NT, HV, V), dtype=idt, device=dev),
                torch.empty((NT, HV, V), dtype=idt, device=dev),
                torch.empty((NC, HV, K, V), dtype=idt, device=dev),
                torch.empty((NT, HV, CHUNK_SIZE), dtype=idt, device=dev))
    return (workspace["w"][:NT], workspace["u"][:NT], workspace["v_new"][:NT],
            workspace["h"][:NC], workspace["aqk"][:NT])


def kept_a_shape(plan: KDADetPlan, NT: int, HV: int) -> tuple[int, ...]:
    """Shape of the A a forward with ``plan`` returns (and a backward with it loads): T
    ``[NT, HV, 64]``, with ``plan.keep_aqk`` stacked with Aqk ``[2, NT, HV, 64]``."""
    return ((2,) if plan.keep_aqk else ()) + (NT, HV, CHUNK_SIZE)


def _consts(plan: KDADetPlan, dtype: torch.dtype) -> dict:
    return dict(DT=_dot_dtype(plan, dtype), PREC=plan.dot_precision, BT=CHUNK_SIZE,
                BK=plan.block_k)


def _prep_and_state(q, k, v, g, beta, scale, initial_state, ht, plan, tabs, g_cumsum, A,
                    scratch, load_a: bool, recompute: bool, aqk_kept: bool = False):
    """Chunk prep (G, T, w, u, Aqk) and the state recurrence (h, v_new, final state). With
    ``recompute`` (the backward) ``g`` is ignored and G is read from ``g_cumsum``; so it is
    with ``plan.fwd_split`` in the forward, whose caller formed G first (the cumsum kernel). With
    ``aqk_kept`` (the backward, ``load_a``, ``plan.keep_aqk``) scratch's aqk is the
    forward's Aqk: neither pairs kernel runs. Returns kg ``[B * T, HV, K]`` (k exp(G_last -
    G) in the intermediates' dtype, a scratch of this call, not of the workspace)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    starts, ends, chunk_off, cu_dev, NC = tabs
    N = cu_dev.numel() - 1
    w, u, v_new, h, aqk = scratch
    cst = _consts(plan, q.dtype)
    pairs = bool(plan.fwd_split)
    akks = g_cumsum  # a placeholder pointer unless the pairs kernel fills an A scratch
    if pairs and not aqk_kept:  # the pair products per sub-chunk (G formed), then the prep
        if not load_a:
            akks = torch.empty((B * T, HV, CHUNK_SIZE), dtype=torch.float32, device=q.device)
        kda_fwd_pairs_kernel[(NC * (CHUNK_SIZE // SUB_CHUNK), HV)](
            q, k, g_cumsum, starts, ends, akks, aqk, scale, H, HV, HV // H, K,
            BC=SUB_CHUNK, BKI=plan.block_k_inner, WANT_AKK=not load_a,
            DIAG=plan.pairs_diag, num_warps=plan.num_warps_pairs, DT=cst["DT"],
            PREC=cst["PREC"], BT=CHUNK_SIZE)
        if plan.pairs_diag == 2:  # the diagonal blocks, token-parallel
            kda_fwd_pairs_tok_kernel[(NC * CHUNK_SIZE, _cdiv(HV, plan.tok_heads))](
                q, k, g_cumsum, starts, ends, akks, aqk, scale, H, HV, HV // H, K,
                BT=CHUNK_SIZE, BC=SUB_CHUNK, BKF=next_power_of_2(max(16, K)),
                BH=plan.tok_heads, WANT_AKK=not load_a, num_warps=plan.num_warps_tok)
    kg = torch.empty((B * T, HV, K), dtype=w.dtype, device=q.device)
    inv = bool(plan.inv_kernel) and pairs and not load_a
    if inv:  # T in its own kernel (plan.inv_kernel), then loaded by the prep
        kda_fwd_inv_kernel[(NC, HV)](
            akks, beta, starts, ends, A, HV, PREC=cst["PREC"], BT=CHUNK_SIZE, BC=SUB_CHUNK,
            LOG2_BT=CHUNK_SIZE.bit_length() - 1, LOG2_BC=SUB_CHUNK.bit_length() - 1,
            MODE=plan.inv_kernel, INV_BLOCKED=bool(plan.inv_blocked),
            num_warps=plan.num_warps_inv)
    kda_fwd_prep_kernel[(NC, HV)](
        q, k, v, g_cumsum if recompute or pairs else g, beta, starts, ends, g_cumsum, A, aqk,
        w, u, akks, kg,
        scale, H, HV, HV // H, K, V,
        BC=SUB_CHUNK, LOG2_BT=CHUNK_SIZE.bit_length() - 1, BVF=next_power_of_2(max(16, V)),
        BKI=plan.block_k_inner, LOAD_A=load_a or inv, CUMSUM=not recompute and not pairs,
        DIAG_LOAD=plan.diag_load, PAIRS=pairs,
        INV_BLOCKED=bool(plan.inv_blocked), LOG2_BC=SUB_CHUNK.bit_length() - 1,
        num_warps=plan.num_warps_prep, DT=cst["DT"], PREC=cst["PREC"], BT=CHUNK_SIZE)
    h0 = initial_state if initial_state is not None else g_cumsum
    kda_fwd_h_op_kernel[(N, HV, _cdiv(V, plan.block_v_h))](
        kg, w, u, g_cumsum, cu_dev, chunk_off, h0, h, v_new,
        ht if ht is not None else h,
        H, HV, HV // H, K, V,
        BV=plan.block_v_h, HAS_H0=initial_state is not None, STORE_FINAL=ht is not None,
        num_warps=plan.num_warps_h, num_stages=plan.num_stages_h, **cst)
    return kg


def kda_chunk_fwd(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool,
                  tabs: tuple, plan: KDADetPlan, workspace=None):
    """The chunked KDA forward on checked, contiguous tensors.

    Args:
        q, k: ``[B, T, H, K]`` (already L2-normalised when asked). v: ``[B, T, HV, V]``.
        g: ``[B, T, HV, K]`` per-token log decay (after any gate), fp32 or q's dtype.
        beta: ``[B, T, HV]`` (after any sigmoid). scale: float.
        initial_state: fp32 ``[N, HV, K, V]`` or None. output_final_state: bool.
        tabs: the chunk tables ``(starts, ends, chunk_off, cu, NC)`` of the sequences in the
            ``B * T`` tokens on q's device
            (:func:`cake_core.linear_attention.chunk_tables_for`; read-only).
        plan: a :class:`KDADetPlan`. workspace: a checked KDADetWorkspace or None.

    Returns:
        ``(o, final_state, g_cumsum, A)``: o ``[B, T, HV, V]`` in v's dtype; final_state
        fp32 ``[N, HV, K, V]`` or None; g_cumsum fp32 ``[B * T, HV, K]`` (within-chunk
        cumulative decays); A ``[B * T, HV, 64]`` each chunk's T = (I + A)^-1 in
        :func:`cake_kda_det_train.plan.inter_dtype` (with ``plan.keep_aqk``: ``[2, B * T,
        HV, 64]``, T then each chunk's gated ``scale q k^T``).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, N = B * T, tabs[3].numel() - 1
    dev = q.device
    idt = inter_dtype(plan, q.dtype)
    NC = tabs[4]
    g_cumsum = torch.empty((NT, HV, K), dtype=torch.float32, device=dev)
    if NC and plan.fwd_split:  # G first: the GPU starts before the host's other allocations
        kda_chunk_cumsum_kernel[(NC, HV)](
            g, g_cumsum, tabs[0], tabs[1], HV, K, BT=CHUNK_SIZE, BKI=plan.block_k_inner,
            num_warps=plan.num_warps_intra)
    o = torch.empty((B, T, HV, V), dtype=v.dtype, device=dev)
    # with keep_aqk: T and Aqk stacked, both returned (KDADetPlan.keep_aqk)
    A = torch.empty(kept_a_shape(plan, NT, HV), dtype=idt, device=dev)
    ht = torch.empty((N, HV, K, V), dtype=torch.float32, device=dev) \
        if output_final_state else None
    if NC == 0:  # no tokens: every final state is its initial state
        if ht is not None:
            if initial_state is not None:
                ht.copy_(initial_state)
            else:
                ht.zero_()
        return o, ht, g_cumsum, A
    scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt)
    T_out = A
    if plan.keep_aqk:  # Aqk into the returned stack, not the workspace
        scratch = (*scratch[:4], A[1])
        T_out = A[0]
    _prep_and_state(q, k, v, g, beta, scale, initial_state, ht, plan, tabs, g_cumsum, T_out,
                    scratch, load_a=False, recompute=False)
    _, _, v_new, h, aqk = scratch
    kda_fwd_o_kernel[(NC, HV, _cdiv(V, plan.block_v))](
        q, g_cumsum, aqk, v_new, h, tabs[0], tabs[1], o,
        scale, H, HV, HV // H, K, V,
        BV=plan.block_v, num_warps=plan.num_warps_o, **_consts(plan, q.dtype))
    return o, ht, g_cumsum, A


def kda_chunk_bwd(do, dht, q, k, v, g_cumsum, beta, A, scale: float, initial_state,
                  tabs: tuple, plan: KDADetPlan, workspace=None,
                  grad_dtype: torch.dtype = torch.float32):
    """Backward of :func:`kda_chunk_fwd`: recomputes the chunk quantities from the saved
    g_cumsum (and T when ``A`` is given and matches the plan), runs the state-gradient
    recurrence in reverse, then the chunk-local gradients.

    Args:
        do: ``[B, T, HV, V]``. dht: fp32 ``[N, HV, K, V]`` or None (zero).
        q, k, v, beta, initial_state, tabs, scale: as given to the forward.
        g_cumsum: the forward's. A: the forward's T (with ``plan.keep_aqk`` its ``[2, B *
            T, HV, 64]`` stack of T and Aqk), or None (recomputed).
        grad_dtype: the dtype of the returned dq and dk (fp32 when a backward of the q/k L2
            norm follows, else q's dtype: the cast is fused into the value-head sum).

    Returns:
        ``(dq, dk, dv, dg, dbeta, dh0)``: dq, dk ``grad_dtype`` ``[B, T, H, K]`` (value heads
        of one q/k head added in index order in fp32, cast once); dv ``[B, T, HV, V]`` of
        :func:`cake_core.gemm.direct_store_dtype` of v's dtype; dg fp32
        ``[B, T, HV, K]`` w.r.t. the per-token log decay; dbeta fp32 ``[B, T, HV]``; dh0
        fp32 ``[N, HV, K, V]``, or None without an initial state.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, N = B * T, tabs[3].numel() - 1
    dev = q.device
    f32 = torch.float32
    idt = inter_dtype(plan, q.dtype)
    NC = tabs[4]
    dq_hv = torch.empty((NT, HV, K), dtype=f32, device=dev)
    dk_hv = torch.empty((NT, HV, K), dtype=f32, device=dev)
    # with one value head per q/k head, the token-parallel kernel (the last to add to dq and
    # dk) stores them in grad_dtype itself: no value-head sum, no cast pass (an H200,
    # 2026-12-02: GDN's two such passes took 2 x 94 us at its case b). The same bits: a sum
    # of one term is the term and both casts round to nearest even (under the interpreter
    # bf16 stays fp32 and torch casts, as group_sum_cast does there)
    direct = HV == H and bool(plan.bwd_split) and bool(plan.bwd_diag)
    odt = direct_store_dtype(grad_dtype) if direct else f32
    dq_out, dk_out = (dq_hv, dk_hv) if odt == f32 else (
        torch.empty((NT, HV, K), dtype=odt, device=dev),
        torch.empty((NT, HV, K), dtype=odt, device=dev))
    # stored once: the kernel writes v's dtype (fp32 under the interpreter for bf16, whose
    # in-kernel bf16 cast truncates; the caller's cast rounds to nearest even)
    dv = torch.empty((B, T, HV, V), dtype=direct_store_dtype(v.dtype), device=dev)
    dg = torch.empty((B, T, HV, K), dtype=f32, device=dev)
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
        load_a = bool(plan.keep_a) and A is not None and A.dtype == idt and \
            tuple(A.shape) == kept_a_shape(plan, NT, HV)
        scratch = _scratch(workspace, NT, NC, HV, K, V, dev, idt)
        aqk_kept = load_a and bool(plan.keep_aqk)
        if aqk_kept:  # T and the forward's Aqk: no pairs kernel runs
            scratch = (*scratch[:4], A[1])
            A = A[0]
        if not load_a:
            A = torch.empty((NT, HV, CHUNK_SIZE), dtype=idt, device=dev)
        g_cs = g_cumsum
        kg = _prep_and_state(q, k, v, None, beta, scale, initial_state, None, plan, tabs,
                             g_cs, A, scratch, load_a=load_a, recompute=True,
                             aqk_kept=aqk_kept)
        w, _, v_new, h, aqk = scratch
        cst = _consts(plan, q.dtype)
        dh = torch.empty((NC, HV, K, V), dtype=idt, device=dev)
        du = torch.empty((NT, HV, V), dtype=idt, device=dev)
        dht_c = dht.contiguous() if dht is not None else None
        kda_bwd_dh_op_kernel[(N, HV, _cdiv(V, plan.block_v_h))](
            q, kg, w, g_cs, aqk, do, tabs[3], tabs[2],
            dht_c if dht_c is not None else dh, dh, du, dh0 if dh0 is not None else dh,
            scale, H, HV, HV // H, K, V,
            BV=plan.block_v_h, HAS_DHT=dht is not None, STORE_DH0=dh0 is not None,
            num_warps=plan.num_warps_dh, num_stages=plan.num_stages_dh, **cst)
        # diag_load = 2 / bwd_split: fp32 copies of each chunk's dA and gated dAqk (FLA keeps
        # the same two [T, 64] matrices), read back by the same program / the split kernel
        split = bool(plan.bwd_split)
        pscr = torch.empty((NT, HV, 2 * CHUNK_SIZE), dtype=f32, device=dev) \
            if plan.diag_load == 2 or split else dg
        kda_bwd_local_kernel[(NC, HV)](
            q, k, v, beta, g_cs, A, h, dh, do, v_new, du, tabs[0], tabs[1],
            dq_hv, dk_hv, dv, dg, dbeta, pscr,
            scale, H, HV, HV // H, K, V,
            BC=SUB_CHUNK, BKI=plan.block_k_inner, BV=plan.block_v_bwd,
            NV=_cdiv(V, plan.block_v_bwd), DIAG_LOAD=plan.diag_load,
            P_LOAD=plan.diag_load == 2, SPLIT=split,
            num_warps=plan.num_warps_bwd, DT=cst["DT"],
            PREC=cst["PREC"], BT=CHUNK_SIZE,
            **({"maxnreg": BWD_MAXNREG} if BWD_MAXNREG else {}))
        if split:  # step 3 per 16-token sub-chunk, then dg's reverse cumsum per chunk
            kda_bwd_intra_kernel[(NC * (CHUNK_SIZE // SUB_CHUNK), HV)](
                q, k, beta, g_cs, pscr, tabs[0], tabs[1], dq_hv, dk_hv, dg, dbeta,
                H, HV, HV // H, K,
                BC=SUB_CHUNK, BKI=plan.block_k_inner, num_warps=plan.num_warps_intra,
                DT=cst["DT"], PREC=cst["PREC"], BT=CHUNK_SIZE, TOK_DIAG=bool(plan.bwd_diag))
            if plan.bwd_diag:  # the terms inside each sub-chunk, token-parallel
                kda_bwd_intra_tok_kernel[(NC * CHUNK_SIZE, _cdiv(HV, plan.tok_heads_bwd))](
                    q, k, beta, g_cs, pscr, tabs[0], tabs[1], dq_hv, dk_hv, dg, dbeta,
                    dq_out, dk_out, H, HV, HV // H, K, BT=CHUNK_SIZE, BC=SUB_CHUNK,
                    BKF=next_power_of_2(max(16, K)), BH=plan.tok_heads_bwd,
                    num_warps=plan.num_warps_tok_bwd)
            kda_bwd_dg_cumsum_kernel[(NC, HV)](
                dg, tabs[0], tabs[1], HV, K, BT=CHUNK_SIZE, BKI=plan.block_k_inner,
                num_warps=plan.num_warps_intra)
    # the fixed-order sum over each q/k head's value heads, fused with the cast to grad_dtype
    if direct:  # stored by the token-parallel kernel (fp32 under the interpreter: cast here)
        dq = dq_out.view(B, T, H, K).to(grad_dtype)
        dk = dk_out.view(B, T, H, K).to(grad_dtype)
    else:
        dq = group_sum_cast(dq_hv, H, grad_dtype).view(B, T, H, K)
        dk = group_sum_cast(dk_hv, H, grad_dtype).view(B, T, H, K)
    return dq, dk, dv, dg, dbeta, dh0
