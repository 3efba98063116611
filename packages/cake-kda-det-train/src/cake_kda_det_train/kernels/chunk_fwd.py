"""Forward chunk kernels of the det chunked KDA (and the backward's recompute).

Per 64-token chunk of one sequence and value head, with ``G`` the within-chunk cumulative
sum of the per-channel log decays g ``[BT, K]``, S0 the state at the chunk's start and
``M`` strictly lower:

    A   = M * beta_i sum_c k_ic k_jc exp(G_ic - G_jc)        T = (I + A)^-1
    w   = T (beta * exp(G) * k)         u = T (beta * v)      (WY/UT form)
    Aqk = scale * sum_c q_ic k_jc exp(G_ic - G_jc), j <= i
    v_new = u - w S0
    o   = scale (q * exp(G)) S0 + Aqk v_new
    S1  = exp(G_last) * S0 + (k * exp(G_last - G))^T v_new

In launch order: ``kda_chunk_cumsum_kernel`` forms G (from the raw g through the in-kernel
gate when it is on); ``kda_fwd_pairs_kernel`` (per
16-token sub-chunk) the pair products with the earlier sub-chunks and
``kda_fwd_pairs_tok_kernel`` (per token) those inside each sub-chunk (raw k k^T to an fp32
scratch, Aqk); ``kda_fwd_inv_kernel`` T; ``kda_fwd_prep_kernel`` (per chunk and value head)
w, u and kg = k exp(G_last - G), key channels in blocks of ``BKI``;
``cake_core.chunk_state.chunk_state_fwd_kernel`` (its per-channel form, shared with GDN;
per sequence, value head and V block) the state recurrence over the sequence's chunks in
order, storing each chunk's S0 and v_new; ``cake_core.chunk_output.chunk_output_kernel``
(its per-channel form, shared with GDN; per chunk, value head, V block) the output. The
backward's recompute runs the same kernels (without the pairs and inverse kernels when the
forward's T and Aqk are given). No atomics: every program writes only its own rows and
columns.
"""

import triton
import triton.language as tl
from cake_core.triangular import unit_lower_inverse

from cake_kda_det_train.kernels.gate import _gate_math


@triton.jit
def kda_fwd_prep_kernel(
    Kp, Vp, GCUM, BETA, CHUNK_START, CHUNK_END, Ap, W, U, KG,
    # runtime ints: as tl.constexpr this kernel hit an illegal address on an H100 (Triton 3.6)
    H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BKI: tl.constexpr,
    BVF: tl.constexpr,
):
    """w, u and kg of one chunk and value head (grid: chunks, value heads) from the T that
    ``kda_fwd_inv_kernel`` stored (or the forward kept, in the backward) and the G of
    ``kda_chunk_cumsum_kernel``; key channels in blocks of ``BKI``."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    cv = tl.arange(0, BVF)
    vmask = tmask[:, None] & (cv < VD)[None, :]
    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    tm = tl.load(Ap + tok[:, None] * (HV * BT) + hv * BT + rows[None, :], mask=tmask[:, None],
                 other=0.0).to(tl.float32)

    vb = tl.load(Vp + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask, other=0.0)
    u = tl.zeros([BT, BVF], dtype=tl.float32)
    u = tl.dot(tm.to(DT), (vb.to(tl.float32) * beta[:, None]).to(DT), u, input_precision=PREC)
    tl.store(U + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], u.to(U.dtype.element_ty),
             mask=vmask)
    for k0 in range(0, KD, BKI):  # w and kg, block by block
        ck = k0 + tl.arange(0, BKI)
        kmask = tmask[:, None] & (ck < KD)[None, :]
        g_off = tok[:, None] * (HV * KD) + hv * KD + ck[None, :]
        gc = tl.load(GCUM + g_off, mask=kmask, other=0.0)
        kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0).to(tl.float32)
        eg = tl.where(kmask, tl.exp(tl.where(kmask, gc, 0.0)), 0.0)
        w = tl.zeros([BT, BKI], dtype=tl.float32)
        w = tl.dot(tm.to(DT), (kb * eg * beta[:, None]).to(DT), w, input_precision=PREC)
        tl.store(W + g_off, w.to(W.dtype.element_ty), mask=kmask)
        # kg = k exp(G_last - G) for the state kernels (cake_core.chunk_state)
        gl = tl.sum(tl.where((tok == end - 1)[:, None], gc, 0.0), axis=0)
        kg = tl.where(kmask, kb * tl.exp(tl.where(kmask, gl[None, :] - gc, 0.0)), 0.0)
        tl.store(KG + g_off, kg.to(KG.dtype.element_ty), mask=kmask)


@triton.jit
def _inv_block(AKKS, BETA, start, end, hv, HV, R: tl.constexpr, C: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr):
    """Block (R, C) (``[BC, BC]``, R >= C) of ``A = M * beta_i akk`` (M: strictly lower,
    rows inside the chunk), fp32."""
    r = tl.arange(0, BC)
    tok = start + R * BC + r
    m = tok < end
    a = tl.load(AKKS + tok[:, None] * (HV * BT) + hv * BT + C * BC + r[None, :],
                mask=m[:, None], other=0.0)
    b = tl.load(BETA + tok * HV + hv, mask=m, other=0.0).to(tl.float32)
    keep = m[:, None]
    if R == C:
        keep = keep & (r[:, None] > r[None, :])
    return tl.where(keep, b[:, None] * a, 0.0)


@triton.jit
def _inv_store(Ap, t, start, end, hv, HV, R: tl.constexpr, C: tl.constexpr,
               BT: tl.constexpr, BC: tl.constexpr):
    r = tl.arange(0, BC)
    tok = start + R * BC + r
    tl.store(Ap + tok[:, None] * (HV * BT) + hv * BT + C * BC + r[None, :],
             t.to(Ap.dtype.element_ty), mask=(tok < end)[:, None])


@triton.jit
def kda_fwd_inv_kernel(
    AKKS, BETA, CHUNK_START, CHUNK_END, Ap, HV: tl.constexpr,
    PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, LOG2_BC: tl.constexpr,
):
    """Each chunk's T = (I + A)^-1 from the raw gated ``k k^T`` of the pairs kernels (fp32
    ``AKKS``, ``[B * T, HV, BT]``) and beta, stored in A's dtype to ``Ap`` (one program per
    chunk and value head; grid: chunks, value heads); the prep then loads it. The four
    ``[BC, BC]`` diagonal blocks inverted apart (doubling), then merged block by block
    (``T_rc = -T_rr sum_{c <= m < r} A_rm T_mc``, the merge of FLA's ``solve_tril``): 16
    dots of ``BC^3`` after the blocks' own, in place of the whole tile's four of ``BT^3``.
    Rows past the chunk's end are not written; T's upper blocks are stored as zeros."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    tl.static_assert(BT == 4 * BC, "the merge takes four diagonal blocks")
    t00 = unit_lower_inverse(_inv_block(AKKS, BETA, start, end, hv, HV, 0, 0, BT, BC),
                             BC, LOG2_BC, PREC)
    t11 = unit_lower_inverse(_inv_block(AKKS, BETA, start, end, hv, HV, 1, 1, BT, BC),
                             BC, LOG2_BC, PREC)
    t22 = unit_lower_inverse(_inv_block(AKKS, BETA, start, end, hv, HV, 2, 2, BT, BC),
                             BC, LOG2_BC, PREC)
    t33 = unit_lower_inverse(_inv_block(AKKS, BETA, start, end, hv, HV, 3, 3, BT, BC),
                             BC, LOG2_BC, PREC)
    a10 = _inv_block(AKKS, BETA, start, end, hv, HV, 1, 0, BT, BC)
    a20 = _inv_block(AKKS, BETA, start, end, hv, HV, 2, 0, BT, BC)
    a21 = _inv_block(AKKS, BETA, start, end, hv, HV, 2, 1, BT, BC)
    a30 = _inv_block(AKKS, BETA, start, end, hv, HV, 3, 0, BT, BC)
    a31 = _inv_block(AKKS, BETA, start, end, hv, HV, 3, 1, BT, BC)
    a32 = _inv_block(AKKS, BETA, start, end, hv, HV, 3, 2, BT, BC)
    t10 = -tl.dot(t11, tl.dot(a10, t00, input_precision=PREC), input_precision=PREC)
    t21 = -tl.dot(t22, tl.dot(a21, t11, input_precision=PREC), input_precision=PREC)
    t32 = -tl.dot(t33, tl.dot(a32, t22, input_precision=PREC), input_precision=PREC)
    s20 = tl.dot(a20, t00, input_precision=PREC)
    s20 = tl.dot(a21, t10, s20, input_precision=PREC)
    t20 = -tl.dot(t22, s20, input_precision=PREC)
    s31 = tl.dot(a31, t11, input_precision=PREC)
    s31 = tl.dot(a32, t21, s31, input_precision=PREC)
    t31 = -tl.dot(t33, s31, input_precision=PREC)
    s30 = tl.dot(a30, t00, input_precision=PREC)
    s30 = tl.dot(a31, t10, s30, input_precision=PREC)
    s30 = tl.dot(a32, t20, s30, input_precision=PREC)
    t30 = -tl.dot(t33, s30, input_precision=PREC)
    z = tl.zeros([BC, BC], dtype=tl.float32)
    _inv_store(Ap, t00, start, end, hv, HV, 0, 0, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 0, 1, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 0, 2, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 0, 3, BT, BC)
    _inv_store(Ap, t10, start, end, hv, HV, 1, 0, BT, BC)
    _inv_store(Ap, t11, start, end, hv, HV, 1, 1, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 1, 2, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 1, 3, BT, BC)
    _inv_store(Ap, t20, start, end, hv, HV, 2, 0, BT, BC)
    _inv_store(Ap, t21, start, end, hv, HV, 2, 1, BT, BC)
    _inv_store(Ap, t22, start, end, hv, HV, 2, 2, BT, BC)
    _inv_store(Ap, z, start, end, hv, HV, 2, 3, BT, BC)
    _inv_store(Ap, t30, start, end, hv, HV, 3, 0, BT, BC)
    _inv_store(Ap, t31, start, end, hv, HV, 3, 1, BT, BC)
    _inv_store(Ap, t32, start, end, hv, HV, 3, 2, BT, BC)
    _inv_store(Ap, t33, start, end, hv, HV, 3, 3, BT, BC)


@triton.jit
def kda_chunk_cumsum_kernel(
    Gp, GCUM, CHUNK_START, CHUNK_END, A_LOG, DT_BIAS, lower_bound, HV: tl.constexpr,
    KD: tl.constexpr, BT: tl.constexpr, BKI: tl.constexpr, GATE: tl.constexpr, HAS_A: tl.constexpr,
    HAS_BIAS: tl.constexpr, LOWER_BOUND: tl.constexpr, THRESHOLD: tl.constexpr,
):
    """G, the cumulative sum of the per-token log decays within each chunk (grid: chunk,
    value head; key channels in blocks of ``BKI``). ``GATE``: G_p holds the raw g and the
    in-kernel gate (kernels/gate.py's ``_gate_math``, which its backward kernel also
    calls) is applied to it here, so the gated g never goes to memory."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    tok = start + tl.arange(0, BT)
    tmask = tok < end
    a_raw = 0.0
    if GATE and HAS_A:
        a_raw = tl.load(A_LOG + hv).to(tl.float32)
    for k0 in range(0, KD, BKI):
        ck = k0 + tl.arange(0, BKI)
        kmask = tmask[:, None] & (ck < KD)[None, :]
        g_off = tok[:, None] * (HV * KD) + hv * KD + ck[None, :]
        g = tl.load(Gp + g_off, mask=kmask, other=0.0).to(tl.float32)
        if GATE:
            if HAS_BIAS:
                g = g + tl.load(DT_BIAS + hv * KD + ck, mask=ck < KD,
                                other=0.0).to(tl.float32)[None, :]
            g, _ = _gate_math(g, a_raw, lower_bound, HAS_A, LOWER_BOUND, THRESHOLD)
            g = tl.where(kmask, g, 0.0)
        tl.store(GCUM + g_off, tl.cumsum(g, axis=0), mask=kmask)


@triton.jit
def kda_fwd_pairs_kernel(
    Qp, Kp, GCUM, CHUNK_START, CHUNK_END, AKKS, AQK,
    scale, H, HV, GROUP, KD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BKI: tl.constexpr,
):
    """The gated pair products of the ``BC`` rows of one sub-chunk ``s`` with the earlier
    sub-chunks (grid: chunk * sub-chunks, value head): ``sum_c L_i k_jc exp(G_ic - G_jc)``
    with L = k (A, raw: stored fp32 to ``AKKS``) and L = q (Aqk, stored times ``scale`` to
    ``AQK``). Per block of key channels, in index order, one ``[BC, BKI] x [BKI, BT]`` dot
    (reference decay: the row before s); s's own ``[BC, BC]`` block is left to
    :func:`kda_fwd_pairs_tok_kernel` (disjoint columns), the later columns stored as zeros.
    Writes only its sub-chunk's rows."""
    c = tl.program_id(0) // (BT // BC)
    s = tl.program_id(0) % (BT // BC)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    s0 = start + s * BC
    if s0 < end:
        rows = tl.arange(0, BT)
        tok = start + rows
        tmask = tok < end
        sr = tl.arange(0, BC)
        stok = s0 + sr
        smask = stok < end
        last_off = (end - 1) * (HV * KD) + hv * KD
        akk = tl.zeros([BC, BT], dtype=tl.float32)
        aqk = tl.zeros([BC, BT], dtype=tl.float32)
        for k0 in range(0, KD, BKI):
            ck = k0 + tl.arange(0, BKI)
            cmask = ck < KD
            kmask = tmask[:, None] & cmask[None, :]
            smk = smask[:, None] & cmask[None, :]
            glast = tl.load(GCUM + last_off + ck, mask=cmask, other=0.0)
            g_s = tl.load(GCUM + stok[:, None] * (HV * KD) + hv * KD + ck[None, :], mask=smk,
                          other=0.0)
            g_s = tl.where(smask[:, None], g_s, glast[None, :])
            qk_s = stok[:, None] * (H * KD) + hk * KD + ck[None, :]
            k_s = tl.load(Kp + qk_s, mask=smk, other=0.0).to(tl.float32)
            q_s = tl.load(Qp + qk_s, mask=smk, other=0.0).to(tl.float32)
            mk = tl.zeros([BC, BT], dtype=tl.float32)
            mq = tl.zeros([BC, BT], dtype=tl.float32)
            if s > 0:  # the earlier sub-chunks, reference: the row before s
                g_all = tl.load(GCUM + tok[:, None] * (HV * KD) + hv * KD + ck[None, :],
                                mask=kmask, other=0.0)
                k_all = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :],
                                mask=kmask, other=0.0).to(tl.float32)
                r = tl.load(GCUM + (s0 - 1) * (HV * KD) + hv * KD + ck, mask=cmask, other=0.0)
                before = (rows < s * BC)[:, None]
                right = tl.where(before, k_all * tl.exp(tl.where(before, r[None, :] - g_all,
                                                                  0.0)), 0.0)
                eg = tl.exp(g_s - r[None, :])
                mk = tl.dot((k_s * eg).to(DT), tl.trans(right.to(DT)), mk, input_precision=PREC)
                mq = tl.dot((q_s * eg).to(DT), tl.trans(right.to(DT)), mq, input_precision=PREC)
            akk += mk
            aqk += mq
        a_off = stok[:, None] * (HV * BT) + hv * BT + rows[None, :]
        # the diagonal block's columns from the [BC, BC] tiles (disjoint stores)
        amask = smask[:, None] & ((rows < s * BC) | (rows >= s * BC + BC))[None, :]
        tl.store(AKKS + a_off, akk, mask=amask)
        tl.store(AQK + a_off, (aqk * scale).to(AQK.dtype.element_ty), mask=amask)


@triton.jit
def kda_fwd_pairs_tok_kernel(
    Qp, Kp, GCUM, CHUNK_START, CHUNK_END, AKKS, AQK,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKF: tl.constexpr, BH: tl.constexpr,
):
    """The diagonal ``[BC, BC]`` blocks of the gated pair products,
    one program per chunk row (token) and block of ``BH`` (``plan.tok_heads``) value heads
    (grid: chunk * BT, cdiv(HV, BH)); the token-parallel form of FLA's
    ``chunk_kda_fwd_intra_token_parallel``. Token i of sub-chunk s pairs with each partner
    j of s up to itself, in order, with all ``KD`` channels in one ``[BH, BKF]`` tile:
    ``e = exp(G_i - G_j)``, ``A[i, j] = sum_c k_ic (k_jc e_c)`` for j < i (raw, fp32 to
    ``AKKS``) and ``Aqk[i, j] = sum_c q_ic (k_jc e_c)`` for j <= i (times
    ``scale``, to ``AQK``), each column stored as soon as it is summed (as FLA's kernel
    does: faster than gathering row i in a ``[BH, BC]`` tile first, with the same bits);
    A's column i is stored as 0 in the loop, and the columns after i get their zeros in one
    masked store (other addresses: no order between the stores is needed; the output
    kernel's ``Aqk v_new`` dot reads those zeros). Writes only row i's ``BC`` diagonal-block
    columns (:func:`kda_fwd_pairs_kernel` writes the rest of the row). H, HV, GROUP and KD are compile-time (faster; measurements:
    docs/benchmarks/kda.md)."""
    c = tl.program_id(0) // BT
    r = tl.program_id(0) % BT
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    i_tok = start + r
    if i_tok < end:
        il = r % BC
        ts = i_tok - il
        hv = tl.program_id(1) * BH + tl.arange(0, BH)
        hmask = hv < HV
        hk = hv // GROUP
        ck = tl.arange(0, BKF)
        m = hmask[:, None] & (ck < KD)[None, :]
        qk_off = hk[:, None] * KD + ck[None, :]
        g_off = hv[:, None] * KD + ck[None, :]
        q_i = tl.load(Qp + i_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
        g_i = tl.load(GCUM + i_tok * (HV * KD) + g_off, mask=m, other=0.0)
        k_i = tl.load(Kp + i_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
        row = i_tok * (HV * BT) + hv * BT + (r - il)
        for jj in range(0, il + 1):
            j_tok = ts + jj
            k_j = tl.load(Kp + j_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
            g_j = tl.load(GCUM + j_tok * (HV * KD) + g_off, mask=m, other=0.0)
            kg = k_j * tl.exp(g_i - g_j)  # masked lanes: k_j = 0, exp(0) = 1
            aq = tl.sum(q_i * kg, axis=1)
            tl.store(AQK + row + jj, (aq * scale).to(AQK.dtype.element_ty), mask=hmask)
            ak = tl.sum(k_i * kg, axis=1)
            tl.store(AKKS + row + jj, tl.where(jj < il, ak, 0.0), mask=hmask)
        cols = tl.arange(0, BC)
        z_off = row[:, None] + cols[None, :]
        zm = hmask[:, None] & (cols > il)[None, :]
        zero = tl.zeros([BH, BC], dtype=tl.float32)
        tl.store(AKKS + z_off, zero, mask=zm)
        tl.store(AQK + z_off, zero.to(AQK.dtype.element_ty), mask=zm)
