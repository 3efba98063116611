"""Output of the forward, one program per (chunk, value head, V block).

With S = h[c] the state at the chunk's start, G the chunk's cumulative log-decay and
``L`` the lower triangle including the diagonal:

    o = scale * ((q * exp(G)) @ S + (L * (q k^T) * exp(G_i - G_j)) @ v_new)

Dots take ``DT`` operands (the inputs' dtype on CUDA) with fp32 accumulation. Each output
row is computed by one program (no atomics); the result is cast once to o's dtype.
"""

import triton
import triton.language as tl


@triton.jit
def gdn_fwd_o_kernel(
    Qp, Kp, VNEW, GCUM, HBUF, CHUNK_START, CHUNK_END,
    O,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    ck = tl.arange(0, BK)
    cv = iv * BV + tl.arange(0, BV)
    kcol = ck < KD
    vcol = cv < VD
    kmask = tmask[:, None] & kcol[None, :]
    vmask = tmask[:, None] & vcol[None, :]

    qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask, other=0.0)
    kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask, other=0.0)
    gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
    s = tl.load(HBUF + (c * HV + hv) * KD * VD + ck[:, None] * VD + cv[None, :],
                mask=kcol[:, None] & vcol[None, :], other=0.0)
    vn = tl.load(VNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask, other=0.0)

    o = tl.zeros([BT, BV], dtype=tl.float32)
    o = tl.dot((qb * tl.exp(gc)[:, None]).to(DT), s.to(DT), o, input_precision=PREC)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    qk = tl.dot(qb.to(DT), tl.trans(kb.to(DT)), qk, input_precision=PREC)
    incl = (rows[:, None] >= rows[None, :]) & tmask[:, None]  # past-the-end rows: G = 0
    att = tl.where(incl, qk * tl.exp(tl.where(incl, gc[:, None] - gc[None, :], 0.0)), 0.0)
    o = tl.dot(att.to(DT), vn.to(DT), o, input_precision=PREC)
    o = o * scale
    tl.store(O + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], o.to(O.dtype.element_ty),
             mask=vmask)
