"""The chunked delta rule's state recurrence, forward and backward, shared by GDN (a scalar
log decay per value head) and KDA (a per-channel one), as two Triton kernels and their
launch helpers.

Per sequence and value head, over the 64-token chunks of the WY/UT form (Yang et al., 2024,
arXiv:2406.06484), with S ``[K, V]`` the state at a chunk's start, G the chunk's cumulative
log decay (a scalar per token, or ``[K]`` per token) and G_last its value at the chunk's last
token, w / u the chunk prep's outputs::

    forward:   h[c]  = S                                       (stored)
               v_new = u - w @ S                               (stored)
               S     = exp(G_last) S + (k exp(G_last - G))^T @ v_new
    backward:  dh[c] = dS                                      (dS: the end-of-chunk gradient)
               dv    = dv_loc + (k exp(G_last - G)) @ dS       (stored)
               dS    = exp(G_last) dS + scale (q exp(G))^T @ do - w^T @ dv

S and dS are fp32 (rounded to ``DT`` only as dot operands, to h's / dh's dtype when stored);
the state after the last chunk is the final state (resp. the initial state's gradient), an
empty sequence passes its initial state (resp. dht) through. One program per (sequence,
value head, V block) runs a sequence's chunks in order (resp. reverse order): no atomics, a
fixed order, so equal inputs and launch parameters give equal bits.

Compile-time forms (each a fixed rounding, so bits are per form):

- ``GK = False`` (GDN): G ``[B*T, HV]``; k ``[B*T, H, K]`` of q/k head ``hv // GROUP``;
  dv_loc = scale P^T do is in ``DV`` on entry (computed beforehand). ``V_DECAY`` picks where
  the decays go: False on the ``[64, K]`` k / q tiles (v_new rounded to its dtype before the
  update), True on the ``[64, BV]`` tiles (FLA's operand form; v_new before its rounding).
- ``GK = True`` (KDA): G ``[B*T, HV, K]``; ``Kp`` is the prep's kg = k exp(G_last - G)
  ``[B*T, HV, K]``; the state decays row-wise by exp(G_last) and dv_loc = Aqk^T do is
  computed here from the prep's ``AQK`` ``[B*T, HV, 64]``.
- ``FLAT``: a one-axis grid of ``N * HV * ceil(V / BV)`` programs, V blocks fastest (the
  programs of a value head, which read the same k / w / q tiles, side by side); else the
  grid ``(N, HV, ceil(V / BV))``. Launch order only: same bits.

Every tile is addressed by a block pointer over the sequence's rows (bounds checked, zero
padding: rows past the end and columns past K / V are zero, their decay exponents 0); the
operands used transposed are loaded transposed. The shape (H, HV, GROUP, K, V) is
compile-time: one build per shape.
"""

from __future__ import annotations

from cake_core.triton_utils import cdiv, select_backend, tl, triton

select_backend()

__all__ = ["chunk_state_bwd", "chunk_state_bwd_kernel", "chunk_state_fwd",
           "chunk_state_fwd_kernel", "state_grid"]


def state_grid(N: int, HV: int, V: int, BV: int, flat: bool) -> tuple[int, ...]:
    """The grid of both kernels: ``(N * HV * ceil(V / BV),)`` with ``flat`` (V blocks
    fastest), else ``(N, HV, ceil(V / BV))``."""
    return (N * HV * cdiv(V, BV),) if flat else (N, HV, cdiv(V, BV))


@triton.jit
def _program(CU, CHUNK_OFF, HV: tl.constexpr, VD: tl.constexpr, BV: tl.constexpr,
             FLAT: tl.constexpr):
    """(sequence n, value head hv, V block iv, first token, tokens, first chunk row)."""
    if FLAT:
        NV: tl.constexpr = (VD + BV - 1) // BV
        pid = tl.program_id(0)
        iv = pid % NV
        hv = (pid // NV) % HV
        n = (pid // (NV * HV)).to(tl.int64)
    else:
        n = tl.program_id(0).to(tl.int64)
        hv = tl.program_id(1)
        iv = tl.program_id(2)
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    return n, hv, iv, bos, (eos - bos).to(tl.int32), c0


@triton.jit
def _scalar_decay(g_base, t0, T, HV: tl.constexpr, BT: tl.constexpr):
    """GDN's decays of one chunk: exp(G_last - G) per row (1 past the end), G, G_last."""
    rows = tl.arange(0, BT)
    tmask = t0 + rows < T
    last = tl.minimum(t0 + BT, T) - 1
    gc = tl.load(g_base + (t0 + rows) * HV, mask=tmask, other=0.0)
    g_last = tl.load(g_base + last * HV)
    return tl.exp(tl.where(tmask, g_last - gc, 0.0)), gc, g_last


@triton.jit
def _channel_last(g_base, t0, T, HV: tl.constexpr, KD: tl.constexpr, BT: tl.constexpr,
                  BK: tl.constexpr):
    """KDA's G_last ``[BK]`` of one chunk (0 past K)."""
    ck = tl.arange(0, BK)
    last = (tl.minimum(t0 + BT, T) - 1).to(tl.int64)  # offsets below reach T*HV*K
    return tl.load(g_base + last * (HV * KD) + ck, mask=ck < KD, other=0.0)


@triton.jit
def chunk_state_fwd_kernel(
    Kp, W, U, GCUM, CU, CHUNK_OFF, H0, HBUF, VNEW, HT,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GK: tl.constexpr, V_DECAY: tl.constexpr, FLAT: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    """h per chunk, v_new and (``STORE_FINAL``) the final state of one (sequence, value
    head, V block); S starts from ``H0`` (``HAS_H0``) or 0."""
    n, hv, iv, bos, T, c0 = _program(CU, CHUNK_OFF, HV, VD, BV, FLAT)
    if GK:
        k_base = Kp + bos * (HV * KD) + hv * KD
        k_row: tl.constexpr = HV * KD
        g_base = GCUM + bos * (HV * KD) + hv * KD
    else:
        k_base = Kp + bos * (H * KD) + (hv // GROUP) * KD
        k_row: tl.constexpr = H * KD
        g_base = GCUM + bos * HV + hv
    w_base = W + bos * (HV * KD) + hv * KD
    u_base = U + bos * (HV * VD) + hv * VD
    vn_base = VNEW + bos * (HV * VD) + hv * VD
    st_off = (n * HV + hv) * KD * VD

    if HAS_H0:
        p_h0 = tl.make_block_ptr(H0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        s = tl.load(p_h0, boundary_check=(0, 1), padding_option="zero")
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)

    if GK:  # the same count either way; each family's own form builds as it did before
        n_chunks = tl.load(CHUNK_OFF + n + 1) - tl.load(CHUNK_OFF + n)
    else:
        n_chunks = (T + BT - 1) // BT
    for ic in range(0, n_chunks):
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
        if not GK:  # k^T where each family's kernel loaded it before the merge (same builds)
            kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
        ws = tl.zeros([BT, BV], dtype=tl.float32)
        ws = tl.dot(wb.to(DT), s.to(DT), ws, input_precision=PREC)
        v32 = ub.to(tl.float32) - ws
        p_vn = tl.make_block_ptr(vn_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        v_new = v32.to(VNEW.dtype.element_ty)
        tl.store(p_vn, v_new, boundary_check=(0, 1))
        if GK:
            glast = _channel_last(g_base, t0, T, HV, KD, BT, BK)
            kt = tl.load(p_kt, boundary_check=(0, 1), padding_option="zero")
            s = s * tl.exp(glast)[:, None]
            s = tl.dot(kt.to(DT), v32.to(DT), s, input_precision=PREC)
        else:
            lam, gc, g_last = _scalar_decay(g_base, t0, T, HV, BT)
            s = s * tl.exp(g_last)
            if V_DECAY:
                s = tl.dot(kt.to(DT), (v32 * lam[:, None]).to(DT), s, input_precision=PREC)
            else:
                s = tl.dot((kt * lam[None, :]).to(DT), v_new.to(DT), s, input_precision=PREC)

    if STORE_FINAL:
        p_ht = tl.make_block_ptr(HT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_ht, s, boundary_check=(0, 1))


@triton.jit
def chunk_state_bwd_kernel(
    Qp, Kp, W, GCUM, AQK, DO, CU, CHUNK_OFF, DHT, DH, DV, DH0,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr,
    VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, GK: tl.constexpr, V_DECAY: tl.constexpr, FLAT: tl.constexpr,
    HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    """dh per chunk, dv (over ``DV``'s dv_loc without ``GK``) and (``STORE_DH0``) the
    initial state's gradient of one (sequence, value head, V block); dS starts from
    ``DHT`` (``HAS_DHT``) or 0. ``AQK`` is read with ``GK`` only."""
    n, hv, iv, bos, T, c0 = _program(CU, CHUNK_OFF, HV, VD, BV, FLAT)
    hk = hv // GROUP
    if GK:
        k_base = Kp + bos * (HV * KD) + hv * KD
        k_row: tl.constexpr = HV * KD
        g_base = GCUM + bos * (HV * KD) + hv * KD
    else:
        k_base = Kp + bos * (H * KD) + hk * KD
        k_row: tl.constexpr = H * KD
        g_base = GCUM + bos * HV + hv
    q_base = Qp + bos * (H * KD) + hk * KD
    w_base = W + bos * (HV * KD) + hv * KD
    a_base = AQK + bos * (HV * BT) + hv * BT
    do_base = DO + bos * (HV * VD) + hv * VD
    dv_base = DV + bos * (HV * VD) + hv * VD
    st_off = (n * HV + hv) * KD * VD

    if HAS_DHT:
        p_dht = tl.make_block_ptr(DHT + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        ds = tl.load(p_dht, boundary_check=(0, 1), padding_option="zero")
    else:
        ds = tl.zeros([BK, BV], dtype=tl.float32)

    if GK:  # the same count either way; each family's own form builds as it did before
        n_chunks = tl.load(CHUNK_OFF + n + 1) - tl.load(CHUNK_OFF + n)
    else:
        n_chunks = (T + BT - 1) // BT
    for r in range(0, n_chunks):
        ic = n_chunks - 1 - r
        t0 = ic * BT
        p_dh = tl.make_block_ptr(DH + ((c0 + ic) * HV + hv) * KD * VD, (KD, VD), (VD, 1),
                                 (0, iv * BV), (BK, BV), (1, 0))
        tl.store(p_dh, ds.to(DH.dtype.element_ty), boundary_check=(0, 1))
        p_k = tl.make_block_ptr(k_base, (T, KD), (k_row, 1), (t0, 0), (BT, BK), (1, 0))
        p_qt = tl.make_block_ptr(q_base, (KD, T), (1, H * KD), (0, t0), (BK, BT), (0, 1))
        p_wt = tl.make_block_ptr(w_base, (KD, T), (1, HV * KD), (0, t0), (BK, BT), (0, 1))
        p_do = tl.make_block_ptr(do_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        p_dv = tl.make_block_ptr(dv_base, (T, VD), (HV * VD, 1), (t0, iv * BV), (BT, BV),
                                 (1, 0))
        # each form's loads in the order its family's kernel had before the merge
        if GK:
            # dv_loc = Aqk^T do, then kg @ dS
            p_at = tl.make_block_ptr(a_base, (BT, T), (1, HV * BT), (0, t0), (BT, BT), (0, 1))
            p_gt = tl.make_block_ptr(g_base, (KD, T), (1, HV * KD), (0, t0), (BK, BT), (0, 1))
            dob = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
            aqkt = tl.load(p_at, boundary_check=(0, 1), padding_option="zero")
            glast = _channel_last(g_base, t0, T, HV, KD, BT, BK)
            kb = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
            dv = tl.zeros([BT, BV], dtype=tl.float32)
            dv = tl.dot(aqkt.to(DT), dob.to(DT), dv, input_precision=PREC)
            dv = tl.dot(kb.to(DT), ds.to(DT), dv, input_precision=PREC)
            dv = dv.to(DV.dtype.element_ty)
            tl.store(p_dv, dv, boundary_check=(0, 1))
            qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            gt = tl.load(p_gt, boundary_check=(0, 1), padding_option="zero")
            wt = tl.load(p_wt, boundary_check=(0, 1), padding_option="zero")
            vt = (tl.arange(0, BK) < KD)[:, None] & (t0 + tl.arange(0, BT) < T)[None, :]
            qgt = tl.where(vt, qt * tl.exp(tl.where(vt, gt, 0.0)), 0.0) * scale
            ds = ds * tl.exp(glast)[:, None]
            ds = tl.dot(qgt.to(DT), dob.to(DT), ds, input_precision=PREC)
            ds = tl.dot(-(wt.to(DT)), dv.to(DT), ds, input_precision=PREC)
        else:
            kb = tl.load(p_k, boundary_check=(0, 1), padding_option="zero")
            qt = tl.load(p_qt, boundary_check=(0, 1), padding_option="zero")
            wt = tl.load(p_wt, boundary_check=(0, 1), padding_option="zero")
            dob = tl.load(p_do, boundary_check=(0, 1), padding_option="zero")
            if V_DECAY:
                dob = dob.to(tl.float32)
            dv = tl.load(p_dv, boundary_check=(0, 1), padding_option="zero").to(tl.float32)
            lam, gc, g_last = _scalar_decay(g_base, t0, T, HV, BT)
            if V_DECAY:
                kd = tl.zeros([BT, BV], dtype=tl.float32)
                kd = tl.dot(kb.to(DT), ds.to(DT), kd, input_precision=PREC)
                dv = (dv + kd * lam[:, None]).to(DV.dtype.element_ty)
                tl.store(p_dv, dv, boundary_check=(0, 1))
                qo = tl.zeros([BK, BV], dtype=tl.float32)
                qo = tl.dot(qt.to(DT), (dob * (tl.exp(gc) * scale)[:, None]).to(DT), qo,
                            input_precision=PREC)
                wd = tl.zeros([BK, BV], dtype=tl.float32)
                wd = tl.dot(wt.to(DT), dv.to(DT), wd, input_precision=PREC)
                ds = ds * tl.exp(g_last) + qo - wd
            else:
                dv = tl.dot((kb * lam[:, None]).to(DT), ds.to(DT), dv, input_precision=PREC)
                dv = dv.to(DV.dtype.element_ty)
                tl.store(p_dv, dv, boundary_check=(0, 1))
                qo = tl.zeros([BK, BV], dtype=tl.float32)
                qo = tl.dot((qt * tl.exp(gc)[None, :]).to(DT), dob.to(DT), qo,
                            input_precision=PREC)
                wd = tl.zeros([BK, BV], dtype=tl.float32)
                wd = tl.dot(wt.to(DT), dv.to(DT), wd, input_precision=PREC)
                ds = ds * tl.exp(g_last) + qo * scale - wd

    if STORE_DH0:
        p_dh0 = tl.make_block_ptr(DH0 + st_off, (KD, VD), (VD, 1), (0, iv * BV), (BK, BV),
                                  (1, 0))
        tl.store(p_dh0, ds, boundary_check=(0, 1))


def _launch_opts(dot_dtype, precision: str, block_k: int, block_v: int, per_channel: bool,
                 decay_on_v: bool, flat_grid: bool, num_warps: int, num_stages: int,
                 chunk_size: int) -> dict:
    return dict(DT=dot_dtype, PREC=precision, BT=chunk_size, BK=block_k, BV=block_v,
                GK=per_channel, V_DECAY=decay_on_v, FLAT=flat_grid, num_warps=num_warps,
                num_stages=num_stages)


def chunk_state_fwd(k, w, u, g_cumsum, cu, chunk_off, initial_state, h, v_new, final_state,
                    *, H: int, HV: int, K: int, V: int, dot_dtype, precision: str,
                    block_k: int, block_v: int, per_channel: bool, decay_on_v: bool = True,
                    flat_grid: bool = False, num_warps: int = 4, num_stages: int = 1,
                    chunk_size: int = 64) -> None:
    """Launch :func:`chunk_state_fwd_kernel` on checked, contiguous tensors (no checks).

    Args:
        k: GDN ``[B*T, H, K]`` keys; KDA (``per_channel``) the prep's kg ``[B*T, HV, K]``.
        w: ``[B*T, HV, K]``; u: ``[B*T, HV, V]`` (the chunk prep's outputs).
        g_cumsum: fp32 within-chunk cumulative log decay, ``[B*T, HV]`` or (``per_channel``)
            ``[B*T, HV, K]``.
        cu, chunk_off: int32 ``[N + 1]`` token and chunk offsets of the N sequences.
        initial_state: fp32 ``[N, HV, K, V]`` or None (zero).
        h: out, ``[NC, HV, K, V]`` (the state at each chunk's start, its dtype).
        v_new: out, ``[B*T, HV, V]``. final_state: out, fp32 ``[N, HV, K, V]``, or None.
        dot_dtype / precision: ``DT`` (a ``tl`` dtype) and ``input_precision`` of the dots.
        block_k: K rounded up to a power of two >= 16. block_v: V columns per program.
        per_channel / decay_on_v / flat_grid: the kernel's ``GK`` / ``V_DECAY`` / ``FLAT``
            (``decay_on_v`` matters without ``per_channel`` only).
    """
    N = cu.numel() - 1
    chunk_state_fwd_kernel[state_grid(N, HV, V, block_v, flat_grid)](
        k, w, u, g_cumsum, cu, chunk_off,
        initial_state if initial_state is not None else g_cumsum, h, v_new,
        final_state if final_state is not None else h,
        H, HV, HV // H, K, V, HAS_H0=initial_state is not None,
        STORE_FINAL=final_state is not None,
        **_launch_opts(dot_dtype, precision, block_k, block_v, per_channel, decay_on_v,
                       flat_grid, num_warps, num_stages, chunk_size))


def chunk_state_bwd(q, k, w, g_cumsum, aqk, do, cu, chunk_off, dht, dh, dv, dh0, scale: float,
                    *, H: int, HV: int, K: int, V: int, dot_dtype, precision: str,
                    block_k: int, block_v: int, per_channel: bool, decay_on_v: bool = True,
                    flat_grid: bool = False, num_warps: int = 4, num_stages: int = 1,
                    chunk_size: int = 64) -> None:
    """Launch :func:`chunk_state_bwd_kernel` on checked, contiguous tensors (no checks).

    Args:
        q: ``[B*T, H, K]``; k, w, g_cumsum, cu, chunk_off and the keywords as
            :func:`chunk_state_fwd`.
        aqk: KDA (``per_channel``): the prep's Aqk ``[B*T, HV, 64]``; else unused (None).
        do: ``[B*T, HV, V]``. dht: fp32 ``[N, HV, K, V]`` or None (zero).
        dh: out, ``[NC, HV, K, V]`` (the gradient of each chunk's end state).
        dv: ``[B*T, HV, V]``: GDN's dv_loc on entry, overwritten by dv; KDA's out.
        dh0: out, fp32 ``[N, HV, K, V]``, or None.
    """
    N = cu.numel() - 1
    chunk_state_bwd_kernel[state_grid(N, HV, V, block_v, flat_grid)](
        q, k, w, g_cumsum, aqk if aqk is not None else g_cumsum, do, cu, chunk_off,
        dht if dht is not None else dh, dh, dv, dh0 if dh0 is not None else dh,
        scale, H, HV, HV // H, K, V, HAS_DHT=dht is not None, STORE_DH0=dh0 is not None,
        **_launch_opts(dot_dtype, precision, block_k, block_v, per_channel, decay_on_v,
                       flat_grid, num_warps, num_stages, chunk_size))
