"""Backward chunk kernels of the det chunked KDA.

With the forward's chunk quantities recomputed (kernels/chunk_fwd.py: G, T, w, Aqk, the
chunk-start states S0 and v_new), per chunk and value head, dS the gradient of the state
after the chunk, ``kd = k exp(G_last - G)``, ``qg = scale q exp(G)``:

    du  = Aqk^T do + kd dS                                (gradient of v_new)
    dS0 = exp(G_last) * dS + qg^T do - w^T du             (carried to the previous chunk)

``cake_core.chunk_state.chunk_state_bwd_kernel`` (its per-channel form, shared with GDN)
runs that recurrence over each sequence's chunks in reverse (per sequence, value head and V
block), storing dS and du per chunk. ``kda_bwd_local_kernel`` (per chunk and value head)
then forms the chunk-local gradients, summing over V blocks (``BV``, the plan's
``block_v_bwd``) in index order, key channels in blocks of ``BKI`` (``block_k_bwd``); the
q/k/g terms before the pair products are parked in the dq, dk, dg outputs and read back by
the sub-chunk kernels:

    dqg = do S0^T   dAqk = do v_new^T   dkd = v_new dS^T   dw = -du S0^T
    dT  = du (beta v)^T + dw (beta k exp(G))^T             dA = -T^T dT T^T (strictly lower)
    dv  = beta T^T du      dk_w = (T^T dw) beta exp(G)
    q/k gradients through the gated pairs (kda_bwd_intra_kernel, kda_bwd_intra_tok_kernel)
    dG  = q dq + k (dk_row + dk_w) - k (dk_col + dk_colq + dk_kd),
          + sum_i k_i dk_kd_i + exp(G_last) sum_v S0 dS  on the last row,
    dg  = reverse cumulative sum of dG within the chunk (then, with the in-kernel gate,
          its backward: kda_bwd_dg_cumsum_kernel)

(derived by hand and checked against autograd of a float64 token recurrence). No atomics:
each program writes only its own chunk's rows.

Each step of the kernel's two loops over V ends with a barrier of the program's warps (as
FLA's ``chunk_kda_bwd_kernel_wy_dqkg_fused``, whose barrier is marked not to be removed):
without it the sm_90 builds with more than 2 warps (Triton 3.6) gave dk, dg and dbeta that
were wrong (4 warps) or changed between identical calls while other processes shared the
GPU (8 warps); with it both matched float64 on an H100 and the 8-warp build repeated
under that load (docs/determinism.md). It orders no arithmetic: the same bits as without it
where both are right.

``kda_bwd_local_kernel``, ``kda_bwd_intra_kernel``, ``kda_bwd_intra_tok_kernel`` and
``kda_bwd_dg_cumsum_kernel`` take the shapes (H, HV, GROUP, KD, VD) as ``tl.constexpr``, so
Triton builds them once per head shape, as FLA's kernels and the state kernels of
cake_core.chunk_state are built: faster, the same bits (measurements: docs/benchmarks/kda.md).
"""

import triton
import triton.language as tl
from cake_core.l2norm import l2norm_bwd_rows

from cake_kda_det_train.kernels.gate import _gate_math


@triton.jit
def kda_bwd_local_kernel(
    Qp, Kp, Vp, BETA, GCUM, Ap, HBUF, DH, DO, VNEW, DU, CHUNK_START, CHUNK_END,
    DQ, DK, DV, DG, DBETA, PS,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BKI: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    tm = tl.load(Ap + tok[:, None] * (HV * BT) + hv * BT + rows[None, :], mask=tmask[:, None],
                 other=0.0).to(tl.float32)
    s_base = (c * HV + hv) * KD * VD
    last_off = (end - 1) * (HV * KD) + hv * KD
    last_row = rows == (end - 1 - start)

    # 1. the V-wide terms without K: dAqk, the (beta v) part of dT, dv, beta's v part
    daqk = tl.zeros([BT, BT], dtype=tl.float32)
    dtm = tl.zeros([BT, BT], dtype=tl.float32)
    dbeta = tl.zeros([BT], dtype=tl.float32)
    for vi in range(NV):  # V blocks in index order
        cv = vi * BV + tl.arange(0, BV)
        vmask = tmask[:, None] & (cv < VD)[None, :]
        u_off = tok[:, None] * (HV * VD) + hv * VD + cv[None, :]
        do = tl.load(DO + u_off, mask=vmask, other=0.0).to(DT)
        vn = tl.load(VNEW + u_off, mask=vmask, other=0.0).to(DT)
        du = tl.load(DU + u_off, mask=vmask, other=0.0).to(DT)
        vb = tl.load(Vp + u_off, mask=vmask, other=0.0).to(tl.float32)
        daqk = tl.dot(do, tl.trans(vn), daqk, input_precision=PREC)
        dtm = tl.dot(du, tl.trans((vb * beta[:, None]).to(DT)), dtm, input_precision=PREC)
        dbv = tl.zeros([BT, BV], dtype=tl.float32)
        dbv = tl.dot(tl.trans(tm.to(DT)), du, dbv, input_precision=PREC)
        tl.store(DV + u_off, (dbv * beta[:, None]).to(DV.dtype.element_ty), mask=vmask)
        dbeta += tl.sum(dbv * vb, axis=1)
        tl.debug_barrier()  # all warps' dots done before the next step (module docstring)
    # the gated dAqk leaves now (daqk is not live through step 2)
    ps_da = PS + hv * (2 * BT)  # [token, 2 * BT] rows: dA, then pq (this chunk's rows only)
    p_off = tok[:, None] * (HV * 2 * BT) + rows[None, :]
    pq = tl.where((rows[:, None] >= rows[None, :]) & tmask[:, None], daqk * scale, 0.0)
    tl.store(ps_da + BT + p_off, pq, mask=tmask[:, None])

    # 2. per block of key channels: the terms through the chunk states (S0 = h, dS = dh),
    # the w part of dT; what is final for dq, dk and dG before the pair products goes to
    # DQ, DK, DG (read back in step 3 by this program only)
    for k0 in range(0, KD, BKI):
        ck = k0 + tl.arange(0, BKI)
        kmask = tmask[:, None] & (ck < KD)[None, :]
        g_off = tok[:, None] * (HV * KD) + hv * KD + ck[None, :]
        qk_off = tok[:, None] * (H * KD) + hk * KD + ck[None, :]
        dqg = tl.zeros([BT, BKI], dtype=tl.float32)
        dkd = tl.zeros([BT, BKI], dtype=tl.float32)
        dw = tl.zeros([BT, BKI], dtype=tl.float32)
        dgl = tl.zeros([BKI], dtype=tl.float32)
        for vi in range(NV):
            cv = vi * BV + tl.arange(0, BV)
            vmask = tmask[:, None] & (cv < VD)[None, :]
            hmask = (ck < KD)[:, None] & (cv < VD)[None, :]
            s_off = s_base + ck[:, None] * VD + cv[None, :]
            h = tl.load(HBUF + s_off, mask=hmask, other=0.0)
            dh = tl.load(DH + s_off, mask=hmask, other=0.0)
            u_off = tok[:, None] * (HV * VD) + hv * VD + cv[None, :]
            do = tl.load(DO + u_off, mask=vmask, other=0.0).to(DT)
            vn = tl.load(VNEW + u_off, mask=vmask, other=0.0).to(DT)
            du = tl.load(DU + u_off, mask=vmask, other=0.0).to(DT)
            dqg = tl.dot(do, tl.trans(h.to(DT)), dqg, input_precision=PREC)
            dkd = tl.dot(vn, tl.trans(dh.to(DT)), dkd, input_precision=PREC)
            dgl += tl.sum(h.to(tl.float32) * dh.to(tl.float32), axis=1)
            dw = tl.dot(du, tl.trans(h.to(DT)), dw, input_precision=PREC)
            tl.debug_barrier()
        dw = -dw
        # loaded after the loop over V: not live through it (fewer registers)
        glast = tl.load(GCUM + last_off + ck, mask=ck < KD, other=0.0)
        gc = tl.load(GCUM + g_off, mask=kmask, other=0.0)
        kb = tl.load(Kp + qk_off, mask=kmask, other=0.0).to(tl.float32)
        qb = tl.load(Qp + qk_off, mask=kmask, other=0.0).to(tl.float32)
        eg = tl.where(kmask, tl.exp(tl.where(kmask, gc, 0.0)), 0.0)
        dtm = tl.dot(dw.to(DT), tl.trans((kb * eg * beta[:, None]).to(DT)), dtm,
                     input_precision=PREC)
        z = tl.zeros([BT, BKI], dtype=tl.float32)
        z = tl.dot(tl.trans(tm.to(DT)), dw.to(DT), z, input_precision=PREC)
        dk_w = z * beta[:, None] * eg
        dbeta += tl.sum(z * kb * eg, axis=1)
        dq_qg = dqg * (scale * eg)
        dk_kd = tl.where(kmask, dkd * tl.exp(tl.where(kmask, glast[None, :] - gc, 0.0)), 0.0)
        dgc = qb * dq_qg + kb * dk_w - kb * dk_kd
        extra = tl.sum(kb * dk_kd, axis=0) + tl.exp(glast) * dgl
        dgc += tl.where(last_row[:, None], extra[None, :], 0.0)
        tl.store(DQ + g_off, dq_qg, mask=kmask)
        tl.store(DK + g_off, dk_w + dk_kd, mask=kmask)
        tl.store(DG + g_off, dgc, mask=kmask)
    tl.debug_barrier()  # step 2's stores are visible to every thread of the program

    # 3. dA = -T^T dT T^T on the strictly lower part (fp32 operands, like the solve), then
    # the gated pair products' gradients, block by block
    t1 = tl.zeros([BT, BT], dtype=tl.float32)
    t1 = tl.dot(tl.trans(tm), dtm, t1, input_precision=PREC)
    da = tl.zeros([BT, BT], dtype=tl.float32)
    da = tl.dot(t1, tl.trans(tm), da, input_precision=PREC)
    da = tl.where((rows[:, None] > rows[None, :]) & tmask[:, None], -da, 0.0)
    # to kda_bwd_intra_kernel (one program per sub-chunk) and kda_bwd_intra_tok_kernel
    tl.store(ps_da + p_off, da, mask=tmask[:, None])
    tl.store(DBETA + tok * HV + hv, dbeta, mask=tmask)


@triton.jit
def kda_bwd_intra_kernel(
    Qp, Kp, BETA, GCUM, PS, CHUNK_START, CHUNK_END, DQ, DK, DG, DBETA,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    BKI: tl.constexpr,
):
    """Step 3 of :func:`kda_bwd_local_kernel` for the ``BC`` rows of one sub-chunk ``s``
    (grid: chunk * sub-chunks, value head), reading the chunk's dA and gated dAqk (``PS``,
    fp32 ``[token, HV, 2 * BT]``) and the parked dq, dk, dG and dbeta that the chunk kernel
    wrote. Per block of key channels, the row sums ``sum_j P_ij k_j exp(G_i - G_j)`` (P =
    dA, then dAqk) over the earlier sub-chunks are one ``[BC, BT] x [BT, BKI]`` dot with
    the reference decay of the row before ``s``; the column sums (P = dA diag(beta) with
    k, dAqk with q) the same over the later sub-chunks (reference: the last row of ``s``).
    The terms inside ``s`` are added by :func:`kda_bwd_intra_tok_kernel`. dG is stored
    before its reverse cumulative sum (:func:`kda_bwd_dg_cumsum_kernel`). Writes only its
    sub-chunk's rows."""
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
        beta_all = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
        beta_s = tl.load(BETA + stok * HV + hv, mask=smask, other=0.0).to(tl.float32)
        ps = HV * 2 * BT
        psb = PS + hv * (2 * BT)
        # P's rows of s [BC, BT] and columns of s [BT, BC] (zero outside the chunk's rows)
        # kept as the dots' operands (DT): what the dots read, in half the registers
        da_s = tl.load(psb + stok[:, None] * ps + rows[None, :], mask=smask[:, None],
                       other=0.0).to(DT)
        pq_s = tl.load(psb + BT + stok[:, None] * ps + rows[None, :], mask=smask[:, None],
                       other=0.0).to(DT)
        c_off = tok[:, None] * ps + (s * BC + sr)[None, :]
        dab_c = (tl.load(psb + c_off, mask=tmask[:, None], other=0.0)
                 * beta_all[:, None]).to(DT)
        pq_c = tl.load(psb + BT + c_off, mask=tmask[:, None], other=0.0).to(DT)
        dbeta = tl.load(DBETA + stok * HV + hv, mask=smask, other=0.0)
        last_off = (end - 1) * (HV * KD) + hv * KD
        for k0 in range(0, KD, BKI):
            ck = k0 + tl.arange(0, BKI)
            cmask = ck < KD
            kmask = tmask[:, None] & cmask[None, :]
            smk = smask[:, None] & cmask[None, :]
            glast = tl.load(GCUM + last_off + ck, mask=cmask, other=0.0)
            # rows past the chunk's end take the last row's G (as the forward's cumsum)
            g_all = tl.load(GCUM + tok[:, None] * (HV * KD) + hv * KD + ck[None, :], mask=kmask,
                            other=0.0)
            g_all = tl.where(tmask[:, None], g_all, glast[None, :])
            qk_all = tok[:, None] * (H * KD) + hk * KD + ck[None, :]
            k_all = tl.load(Kp + qk_all, mask=kmask, other=0.0).to(tl.float32)
            g_off = stok[:, None] * (HV * KD) + hv * KD + ck[None, :]
            g_s = tl.where(smask[:, None], tl.load(GCUM + g_off, mask=smk, other=0.0),
                           glast[None, :])
            qk_s = stok[:, None] * (H * KD) + hk * KD + ck[None, :]
            k_s = tl.load(Kp + qk_s, mask=smk, other=0.0).to(tl.float32)
            q_s = tl.load(Qp + qk_s, mask=smk, other=0.0).to(tl.float32)
            x = tl.zeros([BC, BKI], dtype=tl.float32)       # row sums of dA with k
            dq_row = tl.zeros([BC, BKI], dtype=tl.float32)  # row sums of dAqk with k
            dk_col = tl.zeros([BC, BKI], dtype=tl.float32)  # column sums of dA diag(beta), k
            dk_colq = tl.zeros([BC, BKI], dtype=tl.float32)  # column sums of dAqk with q
            if s > 0:  # the earlier sub-chunks, reference: the row before s
                r = tl.load(GCUM + (s0 - 1) * (HV * KD) + hv * KD + ck, mask=cmask, other=0.0)
                before = (rows < s * BC)[:, None]
                right = tl.where(before, k_all * tl.exp(tl.where(before, r[None, :] - g_all,
                                                                  0.0)), 0.0)
                eg = tl.exp(g_s - r[None, :])
                t = tl.zeros([BC, BKI], dtype=tl.float32)
                t = tl.dot(da_s, right.to(DT), t, input_precision=PREC)
                x += eg * t
                t = tl.zeros([BC, BKI], dtype=tl.float32)
                t = tl.dot(pq_s, right.to(DT), t, input_precision=PREC)
                dq_row += eg * t
            if s < BT // BC - 1:  # the later sub-chunks, reference: the last row of s
                rr = tl.minimum(s0 + BC, end) - 1
                r = tl.load(GCUM + rr * (HV * KD) + hv * KD + ck, mask=cmask, other=0.0)
                after = (rows >= (s + 1) * BC)[:, None]
                ea = tl.exp(tl.where(after, g_all - r[None, :], 0.0))
                left_k = tl.where(after, k_all * ea, 0.0)
                # q's rows loaded where used: not live through the earlier sub-chunks' part
                q_all = tl.load(Qp + qk_all, mask=kmask, other=0.0).to(tl.float32)
                left_q = tl.where(after, q_all * ea, 0.0)
                er = tl.exp(r[None, :] - g_s)
                t = tl.zeros([BC, BKI], dtype=tl.float32)
                t = tl.dot(tl.trans(dab_c), left_k.to(DT), t, input_precision=PREC)
                dk_col += er * t
                t = tl.zeros([BC, BKI], dtype=tl.float32)
                t = tl.dot(tl.trans(pq_c), left_q.to(DT), t, input_precision=PREC)
                dk_colq += er * t
            dbeta += tl.sum(k_s * x, axis=1)
            dk_row = x * beta_s[:, None]
            dq = tl.load(DQ + g_off, mask=smk, other=0.0) + dq_row
            dk = tl.load(DK + g_off, mask=smk, other=0.0) + dk_row + dk_col + dk_colq
            dgc = tl.load(DG + g_off, mask=smk, other=0.0) + q_s * dq_row + k_s * dk_row \
                - k_s * (dk_col + dk_colq)
            tl.store(DQ + g_off, dq, mask=smk)
            tl.store(DK + g_off, dk, mask=smk)
            tl.store(DG + g_off, dgc, mask=smk)
        tl.store(DBETA + stok * HV + hv, dbeta, mask=smask)


@triton.jit
def kda_bwd_intra_tok_kernel(
    Qp, Kp, BETA, GCUM, PS, CHUNK_START, CHUNK_END, DQ, DK, DG, DBETA, DQO, DKO,
    RQ, RK,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, BKF: tl.constexpr, BH: tl.constexpr,
    L2: tl.constexpr,
):
    """After :func:`kda_bwd_intra_kernel`, before :func:`kda_bwd_dg_cumsum_kernel`: the
    terms of step 3 inside each 16-token sub-chunk, one program per chunk row (token i) and
    block of ``BH`` value heads (grid: chunk * BT, cdiv(HV, BH)), all ``KD`` key channels
    in one ``[BH, BKF]`` tile. Over the partners j of i's sub-chunk in order, with P = dA and Q = the gated dAqk (``PS``):
    ``x += P[i, j] k_j exp(G_i - G_j)`` and ``dq_row += Q[i, j] k_j exp(G_i - G_j)`` for
    j <= i; ``dk_col += P[j, i] beta_j k_j exp(G_j - G_i)`` and
    ``dk_colq += Q[j, i] q_j exp(G_j - G_i)`` for j >= i. Then row i gets dq += dq_row,
    dk += x beta_i + dk_col + dk_colq, dG += q_i dq_row + k_i x beta_i - k_i (dk_col +
    dk_colq), dbeta += sum_c k_i x (read, added, stored: each row by one program).
    The last writer of dq and dk: they go to ``DQO`` / ``DKO``, either ``DQ`` / ``DK``
    themselves (fp32, in place) or, with one value head per q/k head, tensors of the
    gradients' dtype (the cast the value-head sum would make, rounded as it rounds).
    ``L2`` (one value head per q/k head only): q and k were L2-normalised by the forward;
    the norm's backward (``cake_core.l2norm.l2norm_bwd_rows``, each program holding whole
    rows) runs here on dq and dk from its outputs, the row's normalised q and k (loaded
    above) and their fp32 rstds ``RQ`` / ``RK`` (``[token, H]``), so dq and dk leave in
    ``DQO`` / ``DKO``'s dtype
    (the inputs', or fp32 for bf16 under the interpreter, cast by the caller)."""
    c = tl.program_id(0) // BT
    r = tl.program_id(0) % BT
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    i_tok = start + r
    if i_tok < end:
        il = r % BC
        ts = i_tok - il
        col0 = r - il  # the sub-chunk's first column in the chunk
        nv = tl.minimum(end - ts, BC)
        hv = tl.program_id(1) * BH + tl.arange(0, BH)
        hmask = hv < HV
        hk = hv // GROUP
        ck = tl.arange(0, BKF)
        m = hmask[:, None] & (ck < KD)[None, :]
        qk_off = hk[:, None] * KD + ck[None, :]
        g_off = hv[:, None] * KD + ck[None, :]
        ps = HV * 2 * BT
        psh = PS + hv * (2 * BT)
        q_i = tl.load(Qp + i_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
        k_i = tl.load(Kp + i_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
        g_i = tl.load(GCUM + i_tok * (HV * KD) + g_off, mask=m, other=0.0)
        beta_i = tl.load(BETA + i_tok * HV + hv, mask=hmask, other=0.0).to(tl.float32)
        x = tl.zeros([BH, BKF], dtype=tl.float32)
        dq_row = tl.zeros([BH, BKF], dtype=tl.float32)
        dk_col = tl.zeros([BH, BKF], dtype=tl.float32)
        dk_colq = tl.zeros([BH, BKF], dtype=tl.float32)
        for jj in range(0, nv):
            j_tok = ts + jj
            k_j = tl.load(Kp + j_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
            g_j = tl.load(GCUM + j_tok * (HV * KD) + g_off, mask=m, other=0.0)
            if jj <= il:  # row i with its earlier partner j (and itself)
                kge = tl.where(m, k_j * tl.exp(tl.where(m, g_i - g_j, 0.0)), 0.0)
                pa = tl.load(psh + i_tok * ps + col0 + jj, mask=hmask, other=0.0)
                pb = tl.load(psh + i_tok * ps + BT + col0 + jj, mask=hmask, other=0.0)
                x += pa[:, None] * kge
                dq_row += pb[:, None] * kge
            if jj >= il:  # column i with its later partner j (and itself)
                q_j = tl.load(Qp + j_tok * (H * KD) + qk_off, mask=m, other=0.0).to(tl.float32)
                e = tl.where(m, tl.exp(tl.where(m, g_j - g_i, 0.0)), 0.0)
                b_j = tl.load(BETA + j_tok * HV + hv, mask=hmask, other=0.0).to(tl.float32)
                pa = tl.load(psh + j_tok * ps + col0 + il, mask=hmask, other=0.0) * b_j
                pb = tl.load(psh + j_tok * ps + BT + col0 + il, mask=hmask, other=0.0)
                dk_col += pa[:, None] * (k_j * e)
                dk_colq += pb[:, None] * (q_j * e)
        row = i_tok * (HV * KD) + g_off
        dk_row = x * beta_i[:, None]
        dq = tl.load(DQ + row, mask=m, other=0.0) + dq_row
        dk = tl.load(DK + row, mask=m, other=0.0) + dk_row + dk_col + dk_colq
        dgc = tl.load(DG + row, mask=m, other=0.0) + q_i * dq_row + k_i * dk_row \
            - k_i * (dk_col + dk_colq)
        if L2:  # GROUP == 1: value head hv is q/k head hv, whose rows are q_i and k_i
            r_off = i_tok * H + hk
            dq = l2norm_bwd_rows(dq, q_i, tl.load(RQ + r_off, mask=hmask, other=0.0))
            dk = l2norm_bwd_rows(dk, k_i, tl.load(RK + r_off, mask=hmask, other=0.0))
        tl.store(DQO + row, dq.to(DQO.dtype.element_ty), mask=m)
        tl.store(DKO + row, dk.to(DKO.dtype.element_ty), mask=m)
        tl.store(DG + row, dgc, mask=m)
        db = tl.load(DBETA + i_tok * HV + hv, mask=hmask, other=0.0) + tl.sum(k_i * x, axis=1)
        tl.store(DBETA + i_tok * HV + hv, db, mask=hmask)


@triton.jit
def kda_bwd_dg_cumsum_kernel(
    DG, DGO, Gp, A_LOG, DT_BIAS, DA_PART, DBIAS_PART, lower_bound, CHUNK_START, CHUNK_END,
    HV: tl.constexpr, KD: tl.constexpr, BT: tl.constexpr, BKI: tl.constexpr,
    GATE: tl.constexpr, HAS_A: tl.constexpr, HAS_BIAS: tl.constexpr,
    LOWER_BOUND: tl.constexpr, THRESHOLD: tl.constexpr,
):
    """dg = the reverse cumulative sum of dG (fp32 ``DG``) within each chunk, stored to
    ``DGO`` in its dtype (``DGO`` may be ``DG``: each element is read before it is written,
    by the same program). Grid: chunk, value head; key channels in blocks of ``BKI``.
    ``GATE``: dG is w.r.t. the in-kernel gate of the raw g in ``Gp``; its backward
    (kernels/gate.py's formulas) turns dg into the gradient w.r.t. the raw g here, and the
    program stores its chunk's sums for dA_log (``DA_PART[c, hv]``, over the chunk's tokens
    and channels, key blocks in order) and dt_bias (``DBIAS_PART[c, hv * K + k]``)."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    tok = start + tl.arange(0, BT)
    tmask = tok < end
    a_raw = 0.0
    if GATE and HAS_A:
        a_raw = tl.load(A_LOG + hv).to(tl.float32)
    da_sum = 0.0
    for k0 in range(0, KD, BKI):
        ck = k0 + tl.arange(0, BKI)
        kmask = tmask[:, None] & (ck < KD)[None, :]
        g_off = tok[:, None] * (HV * KD) + hv * KD + ck[None, :]
        dgc = tl.load(DG + g_off, mask=kmask, other=0.0)
        dgc = tl.cumsum(dgc, axis=0, reverse=True)
        if GATE:
            x = tl.load(Gp + g_off, mask=kmask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                x = x + tl.load(DT_BIAS + hv * KD + ck, mask=ck < KD,
                                other=0.0).to(tl.float32)[None, :]
            gate, dgate_dx = _gate_math(x, a_raw, lower_bound, HAS_A, LOWER_BOUND, THRESHOLD)
            dx = tl.where(kmask, dgc * dgate_dx, 0.0)
            if HAS_A:
                if LOWER_BOUND:
                    da = tl.where(kmask, dx * x, 0.0)
                else:
                    da = tl.where(kmask, dgc * gate, 0.0)
                da_sum += tl.sum(tl.sum(da, axis=1), axis=0)
            if HAS_BIAS:
                tl.store(DBIAS_PART + (c * HV + hv) * KD + ck, tl.sum(dx, axis=0),
                         mask=ck < KD)
            dgc = dx
        tl.store(DGO + g_off, dgc.to(DGO.dtype.element_ty), mask=kmask)
    if GATE and HAS_A:
        tl.store(DA_PART + c * HV + hv, da_sum)
