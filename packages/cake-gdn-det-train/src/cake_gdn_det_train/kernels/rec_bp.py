"""The two chunk-recurrence kernels in FLA's operand form (plan ``rec_form = 1``).

Same programs, order and math as kernels/fwd_h.py and kernels/bwd_dh.py (one program per
(sequence, value head, V block), chunks in order, resp. reverse order; no atomics; here on
a one-axis grid, :func:`state_grid`), with three changes that shorten each serial step:

- every tile is addressed by a block pointer over the sequence's rows (base, shape,
  strides; bounds checked per block, zero padding) instead of a tensor of per-element
  pointers and masks;
- the operands used transposed (k in the forward; q and w in the backward) are loaded as
  ``[K, 64]`` tiles, so the loads feed the dots unchanged (no register transpose, no
  product on a ``[64, K]`` tile);
- the decays multiply the ``[64, BV]`` tiles instead:

    forward:   v_new = u - w @ S                  (stored)
               S     = exp(G_last) S + k^T @ (exp(G_last - G) * v_new)
    backward:  dv_new = dv_loc + exp(G_last - G) * (k @ dS)     (stored over dv_loc)
               dS     = exp(G_last) dS + q^T @ (scale exp(G) * do) - w^T @ dv_new

  where the original form scales k (and q) by the same factors before the dots. Same math,
  other rounding: the bits differ from ``rec_form = 0`` and are fixed per plan. The
  forward's state update uses v_new before its rounding to the stored dtype (as FLA).

The shape (H, HV, GROUP, K, V) is compile-time (one build per shape, as FLA's) and the
grid is one axis of ``N * HV * ceil(V / BV)`` programs, V blocks fastest
(:func:`state_grid`): the programs of a value head, which read the same tiles, run side by
side; faster with the same bits (measurements: docs/benchmarks/gdn.md).

S / dS are fp32, rounded to ``DT`` only as dot operands and to h's / dh's dtype when
stored; initial state, final state, dh0 and dht are fp32.
"""

import triton
import triton.language as tl


def state_grid(N: int, HV: int, V: int, BV: int) -> tuple[int]:
    """The launch grid of both kernels: ``(N * HV * ceil(V / BV),)``, V blocks fastest."""
    return (N * HV * triton.cdiv(V, BV),)


@triton.jit
def gdn_fwd_h_bp_kernel(
    Kp, W, U, GCUM, CU, CHUNK_OFF, H0,
    HBUF, VNEW, HT,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    # one axis, V blocks fastest: the programs of a value head, which read the same k / w
    # (and q) tiles, are launched side by side (faster, the same bits)
    NV: tl.constexpr = (VD + BV - 1) // BV
    pid = tl.program_id(0)
    iv = pid % NV
    hv = (pid // NV) % HV
    n = (pid // (NV * HV)).to(tl.int64)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    T = (eos - bos).to(tl.int32)
    n_chunks = (T + BT - 1) // BT
    rows = tl.arange(0, BT)

    k_base = Kp + bos * (H * KD) + hk * KD
    w_base = W + bos * (HV * KD) + hv * KD
    u_base = U + bos * (HV * VD) + hv * VD
    vn_base = VNEW + bos * (HV * VD) + hv * VD
    g_base = GCUM + bos * HV + hv
    st_off = (n * HV + hv) * KD * VD

    if HAS_H0:
        p_h0 = tl.make_block_ptr(H0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        s = tl.load(p_h0, boundary_check=(0, 1), padding_option="zero")
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)

    for ic in range(0, n_chunks):
        t0 = ic * BT
        p_h = tl.make_block_ptr(HBUF + ((c0 + ic) * HV + hv) * KD * VD, (KD, VD), (VD, 1),
                                (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_h, s.to(HBUF.dtype.element_ty), boundary_check=(0, 1))
        p_w = tl.make_block_ptr(w_base, (T, KD), (HV * KD, 1), (t0, 0), (BT, BK), (1, 0))
        p_u = tl.make_block_ptr(u_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                (1, 0))
        p_kt = tl.make_block_ptr(k_base, (KD, T), (1, H * KD), (0, t0), (BK, BT), (0, 1))
        wb = tl.load(p_w, boundary_check=(0, 1), padding_option="zero")
        ub = tl.load(p_u, boundary_check=(0, 1), padding_option="zero")
        kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
        ws = tl.zeros([BT, BV], dtype=tl.float32)
        ws = tl.dot(wb.to(DT), s.to(DT), ws, input_precision=PREC)
        v32 = ub.to(tl.float32) - ws
        p_vn = tl.make_block_ptr(vn_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        tl.store(p_vn, v32.to(VNEW.dtype.element_ty), boundary_check=(0, 1))
        tmask = t0 + rows < T
        last = tl.minimum(t0 + BT, T) - 1
        gc = tl.load(g_base + (t0 + rows) * HV, mask=tmask, other=0.0)
        g_last = tl.load(g_base + last * HV)
        lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))
        s = s * tl.exp(g_last)
        s = tl.dot(kt.to(DT), (v32 * lam[:, None]).to(DT), s, input_precision=PREC)

    if STORE_FINAL:
        p_ht = tl.make_block_ptr(HT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_ht, s, boundary_check=(0, 1))


@triton.jit
def gdn_bwd_dh_bp_kernel(
    Qp, Kp, W, GCUM, DO, CU, CHUNK_OFF, DHT,
    DH, DVNEW, DH0,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    # one axis, V blocks fastest: the programs of a value head, which read the same k / w
    # (and q) tiles, are launched side by side (as the forward kernel; this one not timed
    # alone)
    NV: tl.constexpr = (VD + BV - 1) // BV
    pid = tl.program_id(0)
    iv = pid % NV
    hv = (pid // NV) % HV
    n = (pid // (NV * HV)).to(tl.int64)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    T = (eos - bos).to(tl.int32)
    n_chunks = (T + BT - 1) // BT
    rows = tl.arange(0, BT)

    q_base = Qp + bos * (H * KD) + hk * KD
    k_base = Kp + bos * (H * KD) + hk * KD
    w_base = W + bos * (HV * KD) + hv * KD
    do_base = DO + bos * (HV * VD) + hv * VD
    dv_base = DVNEW + bos * (HV * VD) + hv * VD
    g_base = GCUM + bos * HV + hv
    st_off = (n * HV + hv) * KD * VD

    if HAS_DHT:
        p_dht = tl.make_block_ptr(DHT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        ds = tl.load(p_dht, boundary_check=(0, 1), padding_option="zero")
    else:
        ds = tl.zeros([BK, BV], dtype=tl.float32)

    for r in range(0, n_chunks):
        ic = n_chunks - 1 - r
        t0 = ic * BT
        p_dh = tl.make_block_ptr(DH + ((c0 + ic) * HV + hv) * KD * VD, (KD, VD), (VD, 1),
                                 (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_dh, ds.to(DH.dtype.element_ty), boundary_check=(0, 1))
        p_k = tl.make_block_ptr(k_base, (T, KD), (H * KD, 1), (t0, 0), (BT, BK), (1, 0))
        p_qt = tl.make_block_ptr(q_base, (KD, T), (1, H * KD), (0, t0), (BK, BT), (0, 1))
        p_wt = tl.make_block_ptr(w_base, (KD, T), (1, HV * KD), (0, t0), (BK, BT), (0, 1))
        p_do = tl.make_block_ptr(do_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        p_dv = tl.make_block_ptr(dv_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        kb = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
        qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")
        wt = tl.load(p_wt, boundary_check=(0, 1), padding_option="zero")
        dob = tl.load(p_do, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        dv = tl.load(p_dv, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
        tmask = t0 + rows < T
        last = tl.minimum(t0 + BT, T) - 1
        gc = tl.load(g_base + (t0 + rows) * HV, mask=tmask, other=0.0)
        g_last = tl.load(g_base + last * HV)
        lam = tl.exp(tl.where(tmask, g_last - gc, 0.0))

        kd = tl.zeros([BT, BV], dtype=tl.float32)
        kd = tl.dot(kb.to(DT), ds.to(DT), kd, input_precision=PREC)
        dv = (dv + kd * lam[:, None]).to(DVNEW.dtype.element_ty)
        tl.store(p_dv, dv, boundary_check=(0, 1))
        qo = tl.zeros([BK, BV], dtype=tl.float32)
        qo = tl.dot(qt.to(DT), (dob * (tl.exp(gc) * scale)[:, None]).to(DT), qo,
                    input_precision=PREC)
        wd = tl.zeros([BK, BV], dtype=tl.float32)
        wd = tl.dot(wt.to(DT), dv.to(DT), wd, input_precision=PREC)
        ds = ds * tl.exp(g_last) + qo - wd

    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(DH0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        tl.store(p_dh0, ds, boundary_check=(0, 1))
