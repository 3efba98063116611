"""The backward's chunk-local value gradient, every chunk at once (before the state
recurrence, which adds the state term in place: cake_core.chunk_state).

With P a chunk's causal decayed scores ``(q k^T) * exp(G_i - G_j)`` (i >= j):

    dv_loc = scale P^T do

stored in the dv buffer's dtype; dots take ``DT`` operands (the inputs' dtype on CUDA) with
fp32 accumulation.
"""

import triton
import triton.language as tl


@triton.jit
def gdn_bwd_dv_local_kernel(
    Qp, Kp, GCUM, DO, CHUNK_START, CHUNK_END,
    DVL,
    scale, H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr,
):
    """dv_loc = scale P^T do for one (chunk, value head, V block), stored in DVL's dtype."""
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
    kmask = tmask[:, None] & (ck < KD)[None, :]
    vmask = tmask[:, None] & (cv < VD)[None, :]
    qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask, other=0.0)
    kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask, other=0.0)
    dob = tl.load(DO + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask,
                  other=0.0)
    gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
    incl_t = (rows[None, :] >= rows[:, None]) & tmask[None, :]  # [j, i]: i >= j, i valid
    kq = tl.zeros([BT, BT], dtype=tl.float32)
    kq = tl.dot(kb.to(DT), tl.trans(qb.to(DT)), kq, input_precision=PREC)
    p_t = tl.where(incl_t, kq * tl.exp(tl.where(incl_t, gc[None, :] - gc[:, None], 0.0)), 0.0)
    dv = tl.zeros([BT, BV], dtype=tl.float32)
    dv = tl.dot(p_t.to(DT), dob.to(DT), dv, input_precision=PREC)
    dv = dv * scale
    tl.store(DVL + tok[:, None] * (HV * VD) + hv * VD + cv[None, :],
             dv.to(DVL.dtype.element_ty), mask=vmask)
