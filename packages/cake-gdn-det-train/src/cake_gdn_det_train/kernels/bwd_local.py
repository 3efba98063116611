"""Chunk-local gradients, one program per (chunk, value head); V in blocks of ``BV``.

Given the chunk's state S = h[c] at its start, dS = dh[c] the gradient of the state at its
end, dv_new (from cake_core.chunk_state), v_new, T = A (saved) and the inputs, this kernel takes the
chunk's forward apart in reverse (G cumulative log-decay, gam = exp(G),
lam = exp(G_last - G), P = (q k^T) * exp(G_i - G_j) for i >= j):

    o      = scale (gam q S + P v_new)           -> dq, dk, dG
    S_next = exp(G_last) S + (lam k)^T v_new     -> dk, dG (G_last and G_i)
    v_new  = u - w S                             -> du = dv_new, dw = -dv_new S^T
    u = T (beta v),  w = T (beta gam k)          -> dT, dv, dbeta, dk, dG
    T = (I + A_raw)^-1                           -> dA_raw = -T^T dT T^T (strictly lower)
    A_raw = beta_i (k_i . k_j) exp(G_i - G_j)    -> dbeta, dk, dG

then dg = the reverse cumulative sum of dG inside the chunk. The terms that read V-wide
tensors (S, dS, do, v_new, dv_new, v) are accumulated over V blocks of ``BV`` columns in
index order (fewer live registers than whole-V tiles); dv is finished per block. dq and dk
are per VALUE head (fp32 ``[NT, HV, K]``); the entry sums each q/k head's group in a fixed
order. No atomics. Dots take ``DT`` operands (the inputs' dtype on CUDA) with fp32
accumulation.
"""

import triton
import triton.language as tl


@triton.jit
def gdn_bwd_local_kernel(
    Qp, Kp, Vp, BETA, GCUM, Ap, HBUF, DH, DO, DVNEW, VNEW, CHUNK_START, CHUNK_END,
    DQ, DK, DV, DG, DBETA,
    scale, H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    ck = tl.arange(0, BK)
    kcol = ck < KD
    kmask = tmask[:, None] & kcol[None, :]
    last_local = end - 1 - start

    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
    g_last = tl.load(GCUM + (end - 1) * HV + hv)
    tm = tl.load(Ap + tok[:, None] * (HV * BT) + hv * BT + rows[None, :],
                 mask=tmask[:, None], other=0.0).to(tl.float32)
    tm_t = tl.trans(tm).to(DT)

    # V-wide terms, accumulated over V blocks in index order
    dos = tl.zeros([BT, BK], dtype=tl.float32)     # do @ S^T
    vds = tl.zeros([BT, BK], dtype=tl.float32)     # v_new @ dS^T
    dvs = tl.zeros([BT, BK], dtype=tl.float32)     # dv_new @ S^T  (= -dw)
    dp = tl.zeros([BT, BT], dtype=tl.float32)      # do @ v_new^T
    dt = tl.zeros([BT, BT], dtype=tl.float32)      # dv_new @ (beta v)^T (first part of dT)
    sds = tl.zeros([BK], dtype=tl.float32)         # row sums of S * dS
    dbeta = tl.zeros([BT], dtype=tl.float32)       # sum over V of v * (T^T dv_new)
    for iv in range(NV):
        cv = iv * BV + tl.arange(0, BV)
        vcol = cv < VD
        vmask = tmask[:, None] & vcol[None, :]
        smask = kcol[:, None] & vcol[None, :]
        s_off = (c * HV + hv) * KD * VD + ck[:, None] * VD + cv[None, :]
        v_off = tok[:, None] * (HV * VD) + hv * VD + cv[None, :]
        s = tl.load(HBUF + s_off, mask=smask, other=0.0).to(tl.float32)
        ds = tl.load(DH + s_off, mask=smask, other=0.0).to(tl.float32)
        dob = tl.load(DO + v_off, mask=vmask, other=0.0).to(tl.float32)
        dvn = tl.load(DVNEW + v_off, mask=vmask, other=0.0).to(tl.float32)
        vn = tl.load(VNEW + v_off, mask=vmask, other=0.0).to(tl.float32)
        vb = tl.load(Vp + v_off, mask=vmask, other=0.0).to(tl.float32)
        s_t = tl.trans(s).to(DT)
        dos = tl.dot(dob.to(DT), s_t, dos, input_precision=PREC)
        dvs = tl.dot(dvn.to(DT), s_t, dvs, input_precision=PREC)
        vds = tl.dot(vn.to(DT), tl.trans(ds).to(DT), vds, input_precision=PREC)
        dp = tl.dot(dob.to(DT), tl.trans(vn).to(DT), dp, input_precision=PREC)
        dt = tl.dot(dvn.to(DT), tl.trans(vb * beta[:, None]).to(DT), dt, input_precision=PREC)
        sds += tl.sum(s * ds, axis=1)
        dbv = tl.zeros([BT, BV], dtype=tl.float32)
        dbv = tl.dot(tm_t, dvn.to(DT), dbv, input_precision=PREC)
        dbeta += tl.sum(vb * dbv, axis=1)
        tl.store(DV + v_off, dbv * beta[:, None], mask=vmask)

    qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                 other=0.0).to(tl.float32)
    kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                 other=0.0).to(tl.float32)
    gam = tl.exp(gc)
    lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))
    # rows past the chunk's end are masked too: their G (0) would overflow exp(G_i - G_j)
    incl = (rows[:, None] >= rows[None, :]) & tmask[:, None]
    strict = (rows[:, None] > rows[None, :]) & tmask[:, None]
    diff = gc[:, None] - gc[None, :]

    # o = scale (gam q S + P v_new)
    dq = dos * (scale * gam)[:, None]
    dg_acc = tl.sum(qb * dq, axis=1)
    d_incl = tl.where(incl, tl.exp(tl.where(incl, diff, 0.0)), 0.0)
    dp = tl.where(incl, dp * scale, 0.0)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    qk = tl.dot(qb.to(DT), tl.trans(kb).to(DT), qk, input_precision=PREC)
    dpp = dp * qk * d_incl
    dg_acc += tl.sum(dpp, axis=1) - tl.sum(dpp, axis=0)
    dpd = dp * d_incl
    dq = tl.dot(dpd.to(DT), kb.to(DT), dq, input_precision=PREC)
    dk = tl.zeros([BT, BK], dtype=tl.float32)
    dk = tl.dot(tl.trans(dpd).to(DT), qb.to(DT), dk, input_precision=PREC)

    # S_next = exp(G_last) S + (lam k)^T v_new
    dk += lam[:, None] * vds
    t3 = lam * tl.sum(kb * vds, axis=1)
    dg_acc -= t3
    dg_last = tl.sum(t3, axis=0) + tl.exp(g_last) * tl.sum(sds, axis=0)

    # v_new = u - w S ; u = T (beta v) ; w = T (beta gam k)
    dw = -dvs
    bk = kb * (beta * gam)[:, None]
    dt = tl.dot(dw.to(DT), tl.trans(bk).to(DT), dt, input_precision=PREC)
    dbk = tl.zeros([BT, BK], dtype=tl.float32)
    dbk = tl.dot(tm_t, dw.to(DT), dbk, input_precision=PREC)
    dk += dbk * (beta * gam)[:, None]
    kdbk = tl.sum(kb * dbk, axis=1)
    dbeta += gam * kdbk
    dg_acc += beta * gam * kdbk

    # T = (I + A_raw)^-1 -> dA_raw = -T^T dT T^T on the strictly lower triangle
    dtt = tl.zeros([BT, BT], dtype=tl.float32)
    dtt = tl.dot(dt.to(DT), tl.trans(tm).to(DT), dtt, input_precision=PREC)
    da = tl.zeros([BT, BT], dtype=tl.float32)
    da = tl.dot(tm_t, dtt.to(DT), da, input_precision=PREC)
    da = tl.where(strict, -da, 0.0)
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    kk = tl.dot(kb.to(DT), tl.trans(kb).to(DT), kk, input_precision=PREC)
    d_strict = tl.where(strict, tl.exp(tl.where(strict, diff, 0.0)), 0.0)
    e = kk * d_strict
    dbeta += tl.sum(da * e, axis=1)
    daa = da * e * beta[:, None]
    dg_acc += tl.sum(daa, axis=1) - tl.sum(daa, axis=0)
    z = da * d_strict * beta[:, None]
    dk = tl.dot(z.to(DT), kb.to(DT), dk, input_precision=PREC)
    dk = tl.dot(tl.trans(z).to(DT), kb.to(DT), dk, input_precision=PREC)

    # G_last is G at the chunk's last token; g's gradient is the reverse cumsum of dG
    dg_acc += tl.where(rows == last_local, dg_last, 0.0)
    dg = tl.sum(tl.where(rows[None, :] >= rows[:, None], dg_acc[None, :], 0.0), axis=1)

    tl.store(DQ + tok[:, None] * (HV * KD) + hv * KD + ck[None, :], dq, mask=kmask)
    tl.store(DK + tok[:, None] * (HV * KD) + hv * KD + ck[None, :], dk, mask=kmask)
    tl.store(DG + tok * HV + hv, dg, mask=tmask)
    tl.store(DBETA + tok * HV + hv, dbeta, mask=tmask)
