"""The backward chunk-local gradients in three kernels (plan ``local_form = 2``).

Same math as kernels/bwd_local.py (see its docstring for the chunk's forward taken apart
in reverse), with the work over K in programs of its own, as FLA's ``chunk_bwd_dqkwg``
divides it (one program per K block; fla/ops/common/chunk_o.py): no whole-K ``[64, K]``
fp32 tile is alive. K is processed in column blocks of ``BK`` (``plan.block_k_local``), V
in blocks of ``BV`` (``plan.block_v_local``), both in index order; the partial sums over
K pass through workspaces and are added in K-block order:

``gdn_bwd_local_kblock_kernel``, one program per (chunk, value head, K block of ``BK``
columns): over V blocks, do S^T, v_new dS^T, dv_new S^T (``[64, BK]``), dp = do v_new^T
(``[64, 64]``, over the whole V: each K block's program forms it) and S . dS; then its
block's dq (final: the state term and dp's), its part of dk (all but the dA terms), its
part of dT (dw (beta gam k)^T over its K columns, to ``WT`` ``[NT, HV, NK, 64]`` in the
intermediates' dtype) and its parts of the row sums that feed dg and dbeta (to ``WV``
``[NK, 2, NT, HV]`` fp32: dg's terms, the chunk-last token's included, and dbeta's).

``gdn_bwd_local_wy_kb_kernel``, one program per (chunk, value head): dT's v part
dv_new (beta v)^T, dv and dbeta's v term over V blocks, then the K blocks' dT parts and row
sums added in K-block order, dA_raw = -T^T dT T^T, k k^T over K blocks, dbeta, dg (reverse
cumulative sum inside the chunk) and z = beta_i dA_raw exp(G_i - G_j) (i > j), stored in
the fp32 workspace ``DZ`` ``[NT, HV, 64]`` (one row per token).

``gdn_bwd_local_dk_kernel``, one program per (chunk, q/k head, K block): per value head
of the q/k head, dk = the stored part + z k + z^T k (a read of rows written by the first
two kernels: a fixed order); the value heads' dk (and, with more than one, their dq) added
in index order in fp32 and cast once to the gradients' dtype: the value-head sum and cast
of ``cake_core.gemm.group_sum_cast``, fused (the same adds in the same order, the same
round to nearest even). With the plan's ``l2norm_local`` (one K block, so every program
holds whole rows) the q/k L2 norm's backward is applied before that cast, here or (dq with
one value head per q/k head) in the first kernel. With one value head per q/k head the first kernel stores dq in
the gradients' dtype itself (``DQ`` fp32 or q's dtype).

Tiles are addressed from scalar int64 bases of the chunk's rows with int32 in-chunk
offsets (per-element int64 addresses cost registers and spills). No atomics: each program
writes only its own rows; each sum over K blocks is an ordered sum of workspace rows.
Other summation order than ``local_form = 0``: other bits, fixed per plan. Dots take
``DT`` operands (the intermediates' dtype on CUDA, fp32 under the interpreter) with fp32
accumulation. The code is cake's own.
"""

import triton
import triton.language as tl
from cake_core.l2norm import l2norm_bwd_rows


@triton.jit
def _l2norm_bwd_at(dy, Y, RSTD, y_off, r_off, kmask, tmask):
    """The q/k L2 norm's backward on whole rows (cake_core.l2norm.l2norm_bwd_rows), reading
    the norm's output rows (the normalised q or k) at ``y_off`` and their fp32 rstd at
    ``r_off``."""
    rstd = tl.load(RSTD + r_off, mask=tmask, other=0.0)
    y = tl.load(Y + y_off, mask=kmask, other=0.0).to(tl.float32)
    return l2norm_bwd_rows(dy, y, rstd)


@triton.jit
def gdn_bwd_local_kblock_kernel(
    Qp, Kp, BETA, GCUM, Ap, HBUF, DH, DO, DVNEW, VNEW, CHUNK_START, CHUNK_END,
    DQ, DK, WT, WV, NT, XQ, RQ,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    L2Q: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    ik = tl.program_id(2)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    last_local = end - 1 - start
    ck = ik * BK + tl.arange(0, BK)
    kcol = ck < KD
    kmask = tmask[:, None] & kcol[None, :]

    # scalar int64 bases of the chunk's rows, int32 in-chunk offsets
    v_base = start * (HV * VD) + hv * VD
    DO = DO + v_base
    DVNEW = DVNEW + v_base
    VNEW = VNEW + v_base
    s_base = (c * HV + hv) * KD * VD
    HBUF = HBUF + s_base
    DH = DH + s_base

    # over V: the state terms of this K block and dp = do v_new^T (the whole V)
    dos = tl.zeros([BT, BK], dtype=tl.float32)     # do @ S^T
    vds = tl.zeros([BT, BK], dtype=tl.float32)     # v_new @ dS^T
    dvs = tl.zeros([BT, BK], dtype=tl.float32)     # dv_new @ S^T  (= -dw)
    dp = tl.zeros([BT, BT], dtype=tl.float32)      # do @ v_new^T
    sds = tl.zeros([BK], dtype=tl.float32)         # sum over V of S * dS, per K column
    for iv in range(NV):
        cv = iv * BV + tl.arange(0, BV)
        vcol = cv < VD
        vmask = tmask[:, None] & vcol[None, :]
        smask = kcol[:, None] & vcol[None, :]
        s_off = ck[:, None] * VD + cv[None, :]
        v_off = rows[:, None] * (HV * VD) + cv[None, :]
        s = tl.load(HBUF + s_off, mask=smask, other=0.0).to(tl.float32)
        ds = tl.load(DH + s_off, mask=smask, other=0.0).to(tl.float32)
        dob = tl.load(DO + v_off, mask=vmask, other=0.0).to(DT)
        dvn = tl.load(DVNEW + v_off, mask=vmask, other=0.0).to(DT)
        vn = tl.load(VNEW + v_off, mask=vmask, other=0.0).to(DT)
        s_t = tl.trans(s).to(DT)
        dos = tl.dot(dob, s_t, dos, input_precision=PREC)
        dvs = tl.dot(dvn, s_t, dvs, input_precision=PREC)
        vds = tl.dot(vn, tl.trans(ds).to(DT), vds, input_precision=PREC)
        dp = tl.dot(dob, tl.trans(vn), dp, input_precision=PREC)
        sds += tl.sum(s * ds, axis=1)

    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
    g_last = tl.load(GCUM + (end - 1) * HV + hv)
    gam = tl.exp(gc)
    lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))
    bgk = beta * gam
    k_off = start * (H * KD) + hk * KD + rows[:, None] * (H * KD) + ck[None, :]
    qb = tl.load(Qp + k_off, mask=kmask, other=0.0).to(tl.float32)
    kb = tl.load(Kp + k_off, mask=kmask, other=0.0).to(tl.float32)

    # o = scale (gam q S + P v_new): P's part of this K block (q k^T over its columns)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    qk = tl.dot(qb.to(DT), tl.trans(kb.to(DT)), qk, input_precision=PREC)
    incl = (rows[:, None] >= rows[None, :]) & tmask[:, None]
    d_incl = tl.where(incl, tl.exp(tl.where(incl, gc[:, None] - gc[None, :], 0.0)), 0.0)
    dpd = tl.where(incl, dp * scale, 0.0) * d_incl
    dpp = dpd * qk
    dg_acc = tl.sum(dpp, axis=1) - tl.sum(dpp, axis=0)
    dpd = dpd.to(DT)

    dq = dos * (scale * gam)[:, None]
    dg_acc += tl.sum(qb * dq, axis=1)
    dq = tl.dot(dpd, kb.to(DT), dq, input_precision=PREC)
    o_off = start * (HV * KD) + hv * KD + rows[:, None] * (HV * KD) + ck[None, :]
    if L2Q:  # one value head per q head, one K block: the L2 norm's backward here
        dq = _l2norm_bwd_at(dq, XQ, RQ, k_off, tok * H + hk, kmask, tmask)
    tl.store(DQ + o_off, dq.to(DQ.dtype.element_ty), mask=kmask)  # once: fp32 or q's

    # S_next = exp(G_last) S + (lam k)^T v_new ; w = T (beta gam k)
    kvds = tl.sum(kb * vds, axis=1)
    t3 = lam * kvds
    dg_acc -= t3
    dg_last = tl.sum(t3, axis=0) + tl.exp(g_last) * tl.sum(sds, axis=0)
    dg_acc += tl.where(rows == last_local, dg_last, 0.0)

    tm_t = tl.trans(tl.load(Ap + start * (HV * BT) + hv * BT + rows[:, None] * (HV * BT)
                            + rows[None, :], mask=tmask[:, None], other=0.0)).to(DT)
    dw = (-dvs).to(DT)
    dtp = tl.zeros([BT, BT], dtype=tl.float32)
    dtp = tl.dot(dw, tl.trans(kb * bgk[:, None]).to(DT), dtp, input_precision=PREC)
    tl.store(WT + start * (HV * NK * BT) + hv * (NK * BT) + ik * BT
             + rows[:, None] * (HV * NK * BT) + rows[None, :], dtp.to(WT.dtype.element_ty),
             mask=tmask[:, None])
    dbk = tl.zeros([BT, BK], dtype=tl.float32)
    dbk = tl.dot(tm_t, dw, dbk, input_precision=PREC)
    kdbk = tl.sum(kb * dbk, axis=1)
    dg_acc += bgk * kdbk
    dk = lam[:, None] * vds + dbk * bgk[:, None]
    dk = tl.dot(tl.trans(dpd), qb.to(DT), dk, input_precision=PREC)
    tl.store(DK + o_off, dk, mask=kmask)
    wv = WV + ik * (2 * NT * HV) + tok * HV + hv
    tl.store(wv, dg_acc, mask=tmask)
    tl.store(wv + NT * HV, gam * kdbk, mask=tmask)


@triton.jit
def gdn_bwd_local_wy_kb_kernel(
    Kp, Vp, BETA, GCUM, Ap, DVNEW, CHUNK_START, CHUNK_END, WT, WV, NT,
    DV, DG, DBETA, DZ,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end

    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
    tm_t = tl.trans(tl.load(Ap + start * (HV * BT) + hv * BT + rows[:, None] * (HV * BT)
                            + rows[None, :], mask=tmask[:, None], other=0.0)).to(DT)
    v_base = start * (HV * VD) + hv * VD
    DVNEW = DVNEW + v_base
    Vp = Vp + v_base
    DV = DV + v_base

    # dT's v part, dv and dbeta's v term per V block
    dt = tl.zeros([BT, BT], dtype=tl.float32)      # dv_new @ (beta v)^T (+ the K blocks')
    dbeta = tl.zeros([BT], dtype=tl.float32)
    for iv in range(NV):
        cv = iv * BV + tl.arange(0, BV)
        vmask = tmask[:, None] & (cv < VD)[None, :]
        v_off = rows[:, None] * (HV * VD) + cv[None, :]
        dvn = tl.load(DVNEW + v_off, mask=vmask, other=0.0).to(DT)
        vb = tl.load(Vp + v_off, mask=vmask, other=0.0).to(tl.float32)
        dt = tl.dot(dvn, tl.trans(vb * beta[:, None]).to(DT), dt, input_precision=PREC)
        dbv = tl.zeros([BT, BV], dtype=tl.float32)
        dbv = tl.dot(tm_t, dvn, dbv, input_precision=PREC)
        dbeta += tl.sum(vb * dbv, axis=1)
        tl.store(DV + v_off, dbv * beta[:, None], mask=vmask)

    # the K blocks' parts, added in K-block order
    pt = WT + start * (HV * NK * BT) + hv * (NK * BT) + rows[:, None] * (HV * NK * BT) \
        + rows[None, :]
    wv = WV + tok * HV + hv
    dg_acc = tl.load(wv, mask=tmask, other=0.0)
    for ik in range(NK):
        dt += tl.load(pt + ik * BT, mask=tmask[:, None], other=0.0).to(tl.float32)
        if ik > 0:
            dg_acc += tl.load(wv + ik * (2 * NT * HV), mask=tmask, other=0.0)
        dbeta += tl.load(wv + ik * (2 * NT * HV) + NT * HV, mask=tmask, other=0.0)

    # T = (I + A_raw)^-1 -> dA_raw = -T^T dT T^T (strictly lower); k k^T over K blocks
    dtt = tl.zeros([BT, BT], dtype=tl.float32)
    dtt = tl.dot(dt.to(DT), tm_t, dtt, input_precision=PREC)
    da = tl.zeros([BT, BT], dtype=tl.float32)
    da = tl.dot(tm_t, dtt.to(DT), da, input_precision=PREC)
    strict = (rows[:, None] > rows[None, :]) & tmask[:, None]
    da = tl.where(strict, -da, 0.0)
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    for ik in range(NK):
        ck = ik * BK + tl.arange(0, BK)
        kmask = tmask[:, None] & (ck < KD)[None, :]
        kb = tl.load(Kp + start * (H * KD) + hk * KD + rows[:, None] * (H * KD) + ck[None, :],
                     mask=kmask, other=0.0).to(DT)
        kk = tl.dot(kb, tl.trans(kb), kk, input_precision=PREC)
    d_strict = tl.where(strict, tl.exp(tl.where(strict, gc[:, None] - gc[None, :], 0.0)), 0.0)
    e = kk * d_strict
    dbeta += tl.sum(da * e, axis=1)
    daa = da * e * beta[:, None]
    dg_acc += tl.sum(daa, axis=1) - tl.sum(daa, axis=0)
    tl.store(DZ + start * (HV * BT) + hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
             da * d_strict * beta[:, None], mask=tmask[:, None])

    # g's gradient is the reverse cumsum of dG inside the chunk
    dg = tl.sum(tl.where(rows[None, :] >= rows[:, None], dg_acc[None, :], 0.0), axis=1)
    tl.store(DG + tok * HV + hv, dg, mask=tmask)
    tl.store(DBETA + tok * HV + hv, dbeta, mask=tmask)


@triton.jit
def _dk_of_head(Kb, DZ, DK, start, hv, rows, tmask, ck, kmask, HV, KD,
                DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr):
    """Value head ``hv``'s dk rows of the chunk: the stored fp32 part + z k + z^T k."""
    z = tl.load(DZ + start * (HV * BT) + hv * BT + rows[:, None] * (HV * BT) + rows[None, :],
                mask=tmask[:, None], other=0.0).to(DT)
    dk = tl.load(DK + start * (HV * KD) + hv * KD + rows[:, None] * (HV * KD) + ck[None, :],
                 mask=kmask, other=0.0)
    dk = tl.dot(z, Kb, dk, input_precision=PREC)
    return tl.dot(tl.trans(z), Kb, dk, input_precision=PREC)


@triton.jit
def gdn_bwd_local_dk_kernel(
    Kp, CHUNK_START, CHUNK_END, DZ, DK, DKO, DQ, DQO, XQ, RQ, XK, RK,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    SUM_DQ: tl.constexpr, L2: tl.constexpr,
):
    """One program per (chunk, q/k head, K block): each of the head's ``GROUP`` value
    heads' dk (:func:`_dk_of_head`), added in index order in fp32 (``((x0 + x1) + ...)``,
    as ``cake_core.gemm.group_sum_cast``), cast once and stored to ``DKO`` ``[NT, H, K]``
    (fp32 or k's dtype; ``DK`` itself when ``GROUP`` is 1 and DKO is fp32). ``SUM_DQ``:
    dq's fp32 parts ``DQ`` ``[NT, HV, K]`` (final per value head) added the same way into
    ``DQO``; else the first kernel stored dq as it is. ``L2`` (one K block: whole rows):
    the q/k L2 norm's backward applied to the sums before the cast (its outputs, the
    normalised ``XQ`` / ``XK`` ``[NT, H, K]``, fp32 rstds ``RQ`` / ``RK`` ``[NT, H]``)."""
    c = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    ik = tl.program_id(2)
    hv0 = hk * GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tmask = start + rows < end
    ck = ik * BK + tl.arange(0, BK)
    kmask = tmask[:, None] & (ck < KD)[None, :]

    # scalar int64 row bases, int32 in-chunk offsets (fewer live address registers)
    kb = tl.load(Kp + start * (H * KD) + hk * KD + rows[:, None] * (H * KD) + ck[None, :],
                 mask=kmask, other=0.0).to(DT)
    # the first head's value, then the others added (no 0 + x0: that would turn -0 into +0)
    dk = _dk_of_head(kb, DZ, DK, start, hv0, rows, tmask, ck, kmask, HV, KD, DT, PREC, BT)
    for j in range(1, GROUP):
        dk += _dk_of_head(kb, DZ, DK, start, hv0 + j, rows, tmask, ck, kmask, HV, KD, DT,
                          PREC, BT)
    o_off = start * (H * KD) + hk * KD + rows[:, None] * (H * KD) + ck[None, :]
    r_off = (start + rows) * H + hk
    if L2:
        dk = _l2norm_bwd_at(dk, XK, RK, o_off, r_off, kmask, tmask)
    tl.store(DKO + o_off, dk.to(DKO.dtype.element_ty), mask=kmask)
    if SUM_DQ:
        qp = DQ + start * (HV * KD) + hv0 * KD + rows[:, None] * (HV * KD) + ck[None, :]
        dq = tl.load(qp, mask=kmask, other=0.0)
        for j in range(1, GROUP):
            dq += tl.load(qp + j * KD, mask=kmask, other=0.0)
        if L2:
            dq = _l2norm_bwd_at(dq, XQ, RQ, o_off, r_off, kmask, tmask)
        tl.store(DQO + o_off, dq.to(DQO.dtype.element_ty), mask=kmask)
