"""The two KDA state-recurrence kernels (FLA's operand form).

One program per (sequence, value head, V block), chunks in order (resp. reverse order), no
atomics, fp32 state. Per chunk, with G the within-chunk cumulative log decay ``[64, K]``
and kg = k exp(G_last - G) stored by the chunk prep (kernels/chunk_fwd.py) in the
intermediates' dtype:

    forward:   v_new = u - w @ S                                  (stored)
               S     = diag(exp(G_last)) S + kg^T @ v_new
    backward:  du    = Aqk^T @ do + kg @ dS                       (stored)
               dS    = diag(exp(G_last)) dS + qg^T @ do - w^T @ du,  qg = scale q exp(G)

Every tile is addressed by a block pointer over the sequence's rows (base, shape, strides;
bounds checked per block, zero padding); the operands used transposed (kg in the forward;
qg and w in the backward) are loaded transposed (kg^T, q^T and G^T, w^T), so the product
feeds the dot as it is: no register transpose of a ``[64, K]`` tile. The forward's state
update takes v_new before its rounding to the stored dtype (as FLA). Masks: rows past the
sequence's end and channels past K are zero (block-pointer padding), the decays' exponents
there are 0.
"""

import triton
import triton.language as tl


@triton.jit
def kda_fwd_h_op_kernel(
    Kp, W, U, GCUM, CU, CHUNK_OFF, H0, HBUF, VNEW, HT,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    """``Kp`` is the prep's kg ``[B * T, HV, K]`` (k exp(G_last - G), the intermediates'
    dtype), loaded transposed straight into the dot (no G tile, no exp tile)."""
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    nch = tl.load(CHUNK_OFF + n + 1) - tl.load(CHUNK_OFF + n)
    T = (eos - bos).to(tl.int32)
    ck = tl.arange(0, BK)

    k_base = Kp + bos * (HV * KD) + hv * KD
    k_row = HV * KD
    w_base = W + bos * (HV * KD) + hv * KD
    g_base = GCUM + bos * (HV * KD) + hv * KD
    u_base = U + bos * (HV * VD) + hv * VD
    vn_base = VNEW + bos * (HV * VD) + hv * VD
    st_off = (n * HV + hv) * KD * VD

    if HAS_H0:
        p_h0 = tl.make_block_ptr(H0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        s = tl.load(p_h0, boundary_check=(0, 1), padding_option="zero")
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)

    for ic in range(nch):
        t0 = ic * BT
        p_h = tl.make_block_ptr(HBUF + ((c0 + ic) * HV + hv) * KD * VD, (KD, VD), (VD, 1),
                                (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_h, s.to(HBUF.dtype.element_ty), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w_base, (T, KD), (HV * KD, 1), (t0, 0), (BT, BK), (1, 0))
        p_u = tl.make_block_ptr(u_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                (1, 0))
        p_kt = tl.make_block_ptr(k_base, (KD, T), (1, k_row), (0, t0), (BK, BT), (0, 1))
        wb = tl.load(p_w, boundary_check=(0, 1), padding_option="zero")
        ub = tl.load(p_u, boundary_check=(0, 1), padding_option="zero")
        ws = tl.zeros([BT, BV], dtype=tl.float32)
        ws = tl.dot(wb.to(DT), s.to(DT), ws, input_precision=PREC)
        v32 = ub.to(tl.float32) - ws
        p_vn = tl.make_block_ptr(vn_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        tl.store(p_vn, v32.to(VNEW.dtype.element_ty), boundary_check=(0, 1))
        last = (tl.minimum(t0 + BT, T) - 1).to(tl.int64)  # offsets below reach T*HV*K
        glast = tl.load(g_base + last * (HV * KD) + ck, mask=ck < KD, other=0.0)
        kgt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
        s = s * tl.exp(glast)[:, None]
        s = tl.dot(kgt.to(DT), v32.to(DT), s, input_precision=PREC)

    if STORE_FINAL:
        p_ht = tl.make_block_ptr(HT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_ht, s, boundary_check=(0, 1))


@triton.jit
def kda_bwd_dh_op_kernel(
    Qp, Kp, W, GCUM, AQK, DO, CU, CHUNK_OFF, DHT, DH, DU, DH0,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    """``Kp`` is the prep's kg ``[B * T, HV, K]``, loaded as kd (no ``[64, K]`` G tile, no
    exp tile)."""
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    nch = tl.load(CHUNK_OFF + n + 1) - tl.load(CHUNK_OFF + n)
    T = (eos - bos).to(tl.int32)
    rows = tl.arange(0, BT)
    ck = tl.arange(0, BK)

    q_base = Qp + bos * (H * KD) + hk * KD
    k_base = Kp + bos * (HV * KD) + hv * KD
    k_row = HV * KD
    w_base = W + bos * (HV * KD) + hv * KD
    g_base = GCUM + bos * (HV * KD) + hv * KD
    a_base = AQK + bos * (HV * BT) + hv * BT
    do_base = DO + bos * (HV * VD) + hv * VD
    du_base = DU + bos * (HV * VD) + hv * VD
    st_off = (n * HV + hv) * KD * VD

    if HAS_DHT:
        p_dht = tl.make_block_ptr(DHT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        dh = tl.load(p_dht, boundary_check=(0, 1), padding_option="zero")
    else:
        dh = tl.zeros([BK, BV], dtype=tl.float32)

    for r in range(nch):
        ic = nch - 1 - r
        t0 = ic * BT
        p_dh = tl.make_block_ptr(DH + ((c0 + ic) * HV + hv) * KD * VD, (KD, VD), (VD, 1),
                                 (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_dh, dh.to(DH.dtype.element_ty), boundary_check=(0, 1))
        p_do = tl.make_block_ptr(do_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        p_du = tl.make_block_ptr(du_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        p_at = tl.make_block_ptr(a_base, (BT, T), (1, HV * BT), (0, t0), (BT, BT), (0, 1))
        p_k = tl.make_block_ptr(k_base, (T, KD), (k_row, 1), (t0, 0), (BT, BK), (1, 0))
        p_qt = tl.make_block_ptr(q_base, (KD, T), (1, H * KD), (0, t0), (BK, BT), (0, 1))
        p_gt = tl.make_block_ptr(g_base, (KD, T), (1, HV * KD), (0, t0), (BK, BT), (0, 1))
        p_wt = tl.make_block_ptr(w_base, (KD, T), (1, HV * KD), (0, t0), (BK, BT), (0, 1))
        dob = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
        aqkt = tl.load(p_at, boundary_check=(0, 1), padding_option="zero")
        last = (tl.minimum(t0 + BT, T) - 1).to(tl.int64)  # offsets below reach T*HV*K
        glast = tl.load(g_base + last * (HV * KD) + ck, mask=ck < KD, other=0.0)
        kd = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        du = tl.zeros([BT, BV], dtype=tl.float32)
        du = tl.dot(aqkt.to(DT), dob.to(DT), du, input_precision=PREC)
        du = tl.dot(kd.to(DT), dh.to(DT), du, input_precision=PREC)
        du = du.to(DU.dtype.element_ty)
        tl.store(p_du, du, boundary_check=(0, 1))
        qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        gt = tl.load(p_gt, boundary_check=(0, 1), padding_option="zero")
        wt = tl.load(p_wt, boundary_check=(0, 1), padding_option="zero")
        vt = (ck < KD)[:, None] & (t0 + rows < T)[None, :]
        qgt = tl.where(vt, qt * tl.exp(tl.where(vt, gt, 0.0)), 0.0) * scale
        dh = dh * tl.exp(glast)[:, None]
        dh = tl.dot(qgt.to(DT), dob.to(DT), dh, input_precision=PREC)
        dh = tl.dot(-(wt.to(DT)), du.to(DT), dh, input_precision=PREC)

    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(DH0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        tl.store(p_dh0, dh, boundary_check=(0, 1))
