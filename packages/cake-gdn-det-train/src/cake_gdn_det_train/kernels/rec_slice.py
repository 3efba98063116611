"""The two chunk-recurrence kernels with the state in K slices (plan ``rec_form = 2``).

The operand form of kernels/rec_bp.py (``rec_form = 1``: block pointers, the transposed
operands k / q / w loaded as ``[BKS, 64]`` tiles straight into the dots, the decays on the
``[64, BV]`` tiles), with the state S (forward) and dS (backward) held as ``NS = BK / BKS``
separate ``[BKS, BV]`` fp32 accumulators of ``BKS = min(64, BK)`` rows each (FLA's
``b_h1``, ``b_h2``, ...): ``s0`` holds rows ``0..BKS-1`` of K, ``s1`` the next ``BKS``, and
so on (1, 2 or 4 slices; a slice past K is all zero and never stored, rows past K in the
last slice are zero padded and masked on store). Each slice updates with its own dots,
so the compiled code has ``[64, BV]`` accumulators and ``[64, 64]``-deep MMA tiles:

    forward:  v_new = u - sum_i w[:, i] @ S_i         (slices summed in index order; stored)
              S_i   = exp(G_last) S_i + k[:, i]^T @ (exp(G_last - G) * v_new)
    backward: dv_new = dv_loc + exp(G_last - G) * sum_i k[:, i] @ dS_i     (index order)
              dS_i   = exp(G_last) dS_i + q[:, i]^T @ (scale exp(G) * do) - w[:, i]^T @ dv_new

Same programs (sequence, value head, V block; here on a 3-axis grid, ``rec_form = 1`` on
one axis), same chunk order, no atomics, each program
writes only its own rows of h / v_new (dh / dv_new), fp32 S and dS, the same outputs and
dtypes as ``rec_form = 1``. The K-contractions (``w S``, ``k dS``) are sums of one dot per
slice: other rounding than one whole-K dot, so other bits than ``rec_form = 1``, fixed per
plan (the slice order is fixed). The per-slice updates are the rows of the whole-K ones.
"""

import triton
import triton.language as tl

#: Rows of K per state slice (FLA's 64); a narrower K takes one slice of ``block_k`` rows.
SLICE_K = 64


@triton.jit
def _ld_rows(base, T, KD, stride_t, t0, k0, BT: tl.constexpr, BKS: tl.constexpr):
    """The ``[BT, BKS]`` tile of rows t0.., columns k0.. of a ``[T, KD]`` view (zero padded)."""
    p = tl.make_block_ptr(base, (T, KD), (stride_t, 1), (t0, k0), (BT, BKS), (1, 0))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero")


@triton.jit
def _ld_cols(base, T, KD, stride_t, t0, k0, BT: tl.constexpr, BKS: tl.constexpr):
    """The same tile transposed, ``[BKS, BT]``, loaded as such (no register transpose)."""
    p = tl.make_block_ptr(base, (KD, T), (1, stride_t), (k0, t0), (BKS, BT), (0, 1))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero")


@triton.jit
def _ld_state(base, KD, VD, k0, v0, BKS: tl.constexpr, BV: tl.constexpr):
    """Rows k0.., columns v0.. of a ``[KD, VD]`` fp32 state (zero padded), as fp32."""
    p = tl.make_block_ptr(base, (KD, VD), (VD, 1), (k0, v0), (BKS, BV), (1, 0))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero").to(tl.float32)


@triton.jit
def _st_state(base, x, KD, VD, k0, v0, BKS: tl.constexpr, BV: tl.constexpr):
    """Store ``x`` (``[BKS, BV]``) at rows k0.., columns v0.. of ``[KD, VD]`` (masked)."""
    p = tl.make_block_ptr(base, (KD, VD), (VD, 1), (k0, v0), (BKS, BV), (1, 0))
    tl.store(p, x.to(base.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _ld_slices(base, KD, VD, v0, BK: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    """The ``BK / BKS`` slices of a ``[KD, VD]`` fp32 state at columns v0.. (zero padded);
    slices past ``BK`` (at most 4 in all) come back as zeros."""
    x0 = _ld_state(base, KD, VD, 0, v0, BKS, BV)
    x1 = tl.zeros([BKS, BV], dtype=tl.float32)
    x2 = tl.zeros([BKS, BV], dtype=tl.float32)
    x3 = tl.zeros([BKS, BV], dtype=tl.float32)
    if BK >= 2 * BKS:
        x1 = _ld_state(base, KD, VD, BKS, v0, BKS, BV)
    if BK >= 4 * BKS:
        x2 = _ld_state(base, KD, VD, 2 * BKS, v0, BKS, BV)
        x3 = _ld_state(base, KD, VD, 3 * BKS, v0, BKS, BV)
    return x0, x1, x2, x3


@triton.jit
def _st_slices(base, x0, x1, x2, x3, KD, VD, v0, BK: tl.constexpr, BKS: tl.constexpr,
               BV: tl.constexpr):
    """Store the ``BK / BKS`` slices at columns v0.. of a ``[KD, VD]`` state (masked)."""
    _st_state(base, x0, KD, VD, 0, v0, BKS, BV)
    if BK >= 2 * BKS:
        _st_state(base, x1, KD, VD, BKS, v0, BKS, BV)
    if BK >= 4 * BKS:
        _st_state(base, x2, KD, VD, 2 * BKS, v0, BKS, BV)
        _st_state(base, x3, KD, VD, 3 * BKS, v0, BKS, BV)


@triton.jit
def _rows_at_slices(base, stride_t, T, KD, t0, x0, x1, x2, x3, DT: tl.constexpr,
                    PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                    BKS: tl.constexpr, BV: tl.constexpr):
    """``sum_i rows[:, slice i] @ x_i`` over the ``BK / BKS`` slices, in slice order: the
    ``[BT, BV]`` fp32 product of rows t0.. of a ``[T, KD]`` view with the sliced state."""
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    a = _ld_rows(base, T, KD, stride_t, t0, 0, BT, BKS)
    acc = tl.dot(a.to(DT), x0.to(DT), acc, input_precision=PREC)
    if BK >= 2 * BKS:
        a = _ld_rows(base, T, KD, stride_t, t0, BKS, BT, BKS)
        acc = tl.dot(a.to(DT), x1.to(DT), acc, input_precision=PREC)
    if BK >= 4 * BKS:
        a = _ld_rows(base, T, KD, stride_t, t0, 2 * BKS, BT, BKS)
        acc = tl.dot(a.to(DT), x2.to(DT), acc, input_precision=PREC)
        a = _ld_rows(base, T, KD, stride_t, t0, 3 * BKS, BT, BKS)
        acc = tl.dot(a.to(DT), x3.to(DT), acc, input_precision=PREC)
    return acc


@triton.jit
def _fwd_slice_update(s, k_base, T, KD, stride_k, t0, k0, vdec, g_exp, DT: tl.constexpr,
                      PREC: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    """S_i = exp(G_last) S_i + k[:, i]^T @ vdec (vdec = the decayed v_new, in ``DT``)."""
    kt = _ld_cols(k_base, T, KD, stride_k, t0, k0, BT, BKS)
    return tl.dot(kt.to(DT), vdec, s * g_exp, input_precision=PREC)


@triton.jit
def _bwd_slice_update(ds, q_base, w_base, T, KD, stride_q, stride_w, t0, k0, dos, dvb, g_exp,
                      DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
                      BKS: tl.constexpr, BV: tl.constexpr):
    """dS_i = exp(G_last) dS_i + q[:, i]^T @ dos - w[:, i]^T @ dvb (as rec_form = 1 per row)."""
    qt = _ld_cols(q_base, T, KD, stride_q, t0, k0, BT, BKS)
    wt = _ld_cols(w_base, T, KD, stride_w, t0, k0, BT, BKS)
    qo = tl.zeros([BKS, BV], dtype=tl.float32)
    qo = tl.dot(qt.to(DT), dos, qo, input_precision=PREC)
    wd = tl.zeros([BKS, BV], dtype=tl.float32)
    wd = tl.dot(wt.to(DT), dvb, wd, input_precision=PREC)
    return ds * g_exp + qo - wd


@triton.jit
def gdn_fwd_h_slice_kernel(
    Kp, W, U, GCUM, CU, CHUNK_OFF, H0,
    HBUF, VNEW, HT,
    H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    T = (eos - bos).to(tl.int32)
    n_chunks = (T + BT - 1) // BT
    rows = tl.arange(0, BT)
    v0 = iv * BV

    k_base = Kp + bos * (H * KD) + hk * KD
    w_base = W + bos * (HV * KD) + hv * KD
    u_base = U + bos * (HV * VD) + hv * VD
    vn_base = VNEW + bos * (HV * VD) + hv * VD
    g_base = GCUM + bos * HV + hv
    st_off = (n * HV + hv) * KD * VD

    # slices 1..3 exist only where BK >= 2 BKS (resp. 4 BKS); unused ones stay zero
    s0 = tl.zeros([BKS, BV], dtype=tl.float32)
    s1 = tl.zeros([BKS, BV], dtype=tl.float32)
    s2 = tl.zeros([BKS, BV], dtype=tl.float32)
    s3 = tl.zeros([BKS, BV], dtype=tl.float32)
    if HAS_H0:
        s0, s1, s2, s3 = _ld_slices(H0 + st_off, KD, VD, v0, BK, BKS, BV)

    for ic in range(0, n_chunks):
        t0 = ic * BT
        h_base = HBUF + ((c0 + ic) * HV + hv) * KD * VD
        _st_slices(h_base, s0, s1, s2, s3, KD, VD, v0, BK, BKS, BV)
        # w S, one dot per slice, summed in slice order
        ws = _rows_at_slices(w_base, HV * KD, T, KD, t0, s0, s1, s2, s3, DT, PREC, BT, BK,
                             BKS, BV)
        p_u = tl.make_block_ptr(u_base, (T, VD), (HV * VD, 1), (t0, v0), (BT, BV), (1, 0))
        ub = tl.load(p_u, boundary_check=(0, 1), padding_option="zero")
        v32 = ub.to(tl.float32) - ws
        p_vn = tl.make_block_ptr(vn_base, (T, VD), (HV * VD, 1), (t0, v0), (BT, BV), (1, 0))
        tl.store(p_vn, v32.to(VNEW.dtype.element_ty), boundary_check=(0, 1))
        tmask = t0 + rows < T
        last = tl.minimum(t0 + BT, T) - 1
        gc = tl.load(g_base + (t0 + rows) * HV, mask=tmask, other=0.0)
        g_last = tl.load(g_base + last * HV)
        lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))
        g_exp = tl.exp(g_last)
        vdec = (v32 * lam[:, None]).to(DT)
        s0 = _fwd_slice_update(s0, k_base, T, KD, H * KD, t0, 0, vdec, g_exp, DT, PREC, BT,
                               BKS)
        if BK >= 2 * BKS:
            s1 = _fwd_slice_update(s1, k_base, T, KD, H * KD, t0, BKS, vdec, g_exp, DT, PREC,
                                   BT, BKS)
        if BK >= 4 * BKS:
            s2 = _fwd_slice_update(s2, k_base, T, KD, H * KD, t0, 2 * BKS, vdec, g_exp, DT,
                                   PREC, BT, BKS)
            s3 = _fwd_slice_update(s3, k_base, T, KD, H * KD, t0, 3 * BKS, vdec, g_exp, DT,
                                   PREC, BT, BKS)

    if STORE_FINAL:
        _st_slices(HT + st_off, s0, s1, s2, s3, KD, VD, v0, BK, BKS, BV)


@triton.jit
def gdn_bwd_dh_slice_kernel(
    Qp, Kp, W, GCUM, DO, CU, CHUNK_OFF, DHT,
    DH, DVNEW, DH0,
    scale, H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BKS: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    T = (eos - bos).to(tl.int32)
    n_chunks = (T + BT - 1) // BT
    rows = tl.arange(0, BT)
    v0 = iv * BV

    q_base = Qp + bos * (H * KD) + hk * KD
    k_base = Kp + bos * (H * KD) + hk * KD
    w_base = W + bos * (HV * KD) + hv * KD
    do_base = DO + bos * (HV * VD) + hv * VD
    dv_base = DVNEW + bos * (HV * VD) + hv * VD
    g_base = GCUM + bos * HV + hv
    st_off = (n * HV + hv) * KD * VD

    d0 = tl.zeros([BKS, BV], dtype=tl.float32)
    d1 = tl.zeros([BKS, BV], dtype=tl.float32)
    d2 = tl.zeros([BKS, BV], dtype=tl.float32)
    d3 = tl.zeros([BKS, BV], dtype=tl.float32)
    if HAS_DHT:
        d0, d1, d2, d3 = _ld_slices(DHT + st_off, KD, VD, v0, BK, BKS, BV)

    for r in range(0, n_chunks):
        ic = n_chunks - 1 - r
        t0 = ic * BT
        dh_base = DH + ((c0 + ic) * HV + hv) * KD * VD
        _st_slices(dh_base, d0, d1, d2, d3, KD, VD, v0, BK, BKS, BV)
        # k dS, one dot per slice, summed in slice order
        kd = _rows_at_slices(k_base, H * KD, T, KD, t0, d0, d1, d2, d3, DT, PREC, BT, BK,
                             BKS, BV)
        p_do = tl.make_block_ptr(do_base, (T, VD), (HV * VD, 1), (t0, v0), (BT, BV), (1, 0))
        p_dv = tl.make_block_ptr(dv_base, (T, VD), (HV * VD, 1), (t0, v0), (BT, BV), (1, 0))
        dob = tl.load(p_do, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        dv = tl.load(p_dv, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        tmask = t0 + rows < T
        last = tl.minimum(t0 + BT, T) - 1
        gc = tl.load(g_base + (t0 + rows) * HV, mask=tmask, other=0.0)
        g_last = tl.load(g_base + last * HV)
        lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))
        dv = (dv + kd * lam[:, None]).to(DVNEW.dtype.element_ty)
        tl.store(p_dv, dv, boundary_check=(0, 1))
        dos = (dob * (tl.exp(gc) * scale)[:, None]).to(DT)
        dvb = dv.to(DT)
        g_exp = tl.exp(g_last)
        d0 = _bwd_slice_update(d0, q_base, w_base, T, KD, H * KD, HV * KD, t0, 0, dos, dvb,
                               g_exp, DT, PREC, BT, BKS, BV)
        if BK >= 2 * BKS:
            d1 = _bwd_slice_update(d1, q_base, w_base, T, KD, H * KD, HV * KD, t0, BKS, dos,
                                   dvb, g_exp, DT, PREC, BT, BKS, BV)
        if BK >= 4 * BKS:
            d2 = _bwd_slice_update(d2, q_base, w_base, T, KD, H * KD, HV * KD, t0, 2 * BKS,
                                   dos, dvb, g_exp, DT, PREC, BT, BKS, BV)
            d3 = _bwd_slice_update(d3, q_base, w_base, T, KD, H * KD, HV * KD, t0, 3 * BKS,
                                   dos, dvb, g_exp, DT, PREC, BT, BKS, BV)

    if STORE_DH0:
        _st_slices(DH0 + st_off, d0, d1, d2, d3, KD, VD, v0, BK, BKS, BV)
