"""Inter-chunk state recurrence, one program per (sequence, value head, V block).

The chunks of a sequence run in order inside one program (fixed order, no atomics). For
each chunk, with S the state at its start and G its cumulative log-decay (G_last at its
last token):

    h[c]  = S                                   (stored for the output kernel)
    v_new = u - w @ S                           (the chunk's delta-rule corrections)
    S     = exp(G_last) S + (k * exp(G_last - G))^T @ v_new

Columns of V never mix, so each V block (``BV``) is independent. S is fp32 (rounded to
``DT`` only as a dot operand, and to h's dtype when stored); it
starts from the initial state (or 0) and, with ``STORE_FINAL``, is written to the final
state after the last chunk (an empty sequence gives back its initial state).
"""

import triton
import triton.language as tl


@triton.jit
def gdn_fwd_h_kernel(
    Kp, W, U, GCUM, CU, CHUNK_OFF, H0,
    HBUF, VNEW, HT,
    H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    bos = tl.load(CU + n).to(tl.int64)
    eos = tl.load(CU + n + 1).to(tl.int64)
    c0 = tl.load(CHUNK_OFF + n).to(tl.int64)
    n_chunks = (eos - bos + BT - 1) // BT

    rows = tl.arange(0, BT)
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    kcol = ck < KD
    vcol = cv < VD
    smask = kcol[:, None] & vcol[None, :]
    s_off = ck[:, None] * VD + cv[None, :]

    if HAS_H0:
        s = tl.load(H0 + (n * HV + hv) * KD * VD + s_off, mask=smask, other=0.0)
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)

    for ic in range(0, n_chunks):
        start = bos + ic * BT
        tok = start + rows
        tmask = tok < eos
        last = tl.minimum(start + BT, eos) - 1
        tl.store(HBUF + ((c0 + ic) * HV + hv) * KD * VD + s_off, s.to(HBUF.dtype.element_ty),
                 mask=smask)
        wb = tl.load(W + tok[:, None] * (HV * KD) + hv * KD + ck[None, :],
                     mask=tmask[:, None] & kcol[None, :], other=0.0)
        ub = tl.load(U + tok[:, None] * (HV * VD) + hv * VD + cv[None, :],
                     mask=tmask[:, None] & vcol[None, :], other=0.0)
        ws = tl.zeros([BT, BV], dtype=tl.float32)
        ws = tl.dot(wb.to(DT), s.to(DT), ws, input_precision=PREC)
        v_new = (ub.to(tl.float32) - ws).to(VNEW.dtype.element_ty)
        tl.store(VNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], v_new,
                 mask=tmask[:, None] & vcol[None, :])
        gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
        g_last = tl.load(GCUM + last * HV + hv)
        kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :],
                     mask=tmask[:, None] & kcol[None, :], other=0.0)
        kdec = (kb * tl.exp(tl.where(tmask, g_last - gc, 0.0))[:, None]).to(DT)
        s = s * tl.exp(g_last)
        s = tl.dot(tl.trans(kdec), v_new.to(DT), s, input_precision=PREC)

    if STORE_FINAL:
        tl.store(HT + (n * HV + hv) * KD * VD + s_off, s, mask=smask)
