"""Backward state recurrence, one program per (sequence, value head, V block), chunks in
reverse order (fixed order, no atomics), after a parallel kernel for its chunk-local part.

With dS the gradient of the state at the END of chunk c (dS = d final_state, or 0, for the
last chunk), P the chunk's causal decayed scores ``(q k^T) * exp(G_i - G_j)`` (i >= j):

    dv_loc = scale P^T do                   (gdn_bwd_dv_local_kernel, every chunk at once,
                                             written into the dv_new buffer)
    dh[c]  = dS                                          (stored for the local kernel)
    dv_new = dv_loc + (k * exp(G_last - G)) @ dS         (overwrites dv_loc)
    dS     = exp(G_last) dS + scale (q * exp(G))^T do - w^T dv_new

and dS after the first chunk is the gradient of the initial state. dS is fp32; dots take
``DT`` operands (the inputs' dtype on CUDA) with fp32 accumulation; dh and dv_new are
stored in their buffers' dtypes.
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


@triton.jit
def gdn_bwd_dh_kernel(
    Qp, Kp, W, GCUM, DO, CU, CHUNK_OFF, DHT,
    DH, DVNEW, DH0,
    scale, H, HV, GROUP, KD, VD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, HAS_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
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

    if HAS_DHT:
        ds = tl.load(DHT + (n * HV + hv) * KD * VD + s_off, mask=smask, other=0.0)
    else:
        ds = tl.zeros([BK, BV], dtype=tl.float32)

    for r in range(0, n_chunks):
        ic = n_chunks - 1 - r
        start = bos + ic * BT
        tok = start + rows
        tmask = tok < eos
        last = tl.minimum(start + BT, eos) - 1
        tl.store(DH + ((c0 + ic) * HV + hv) * KD * VD + s_off, ds.to(DH.dtype.element_ty),
                 mask=smask)
        kmask = tmask[:, None] & kcol[None, :]
        vmask = tmask[:, None] & vcol[None, :]
        qb = tl.load(Qp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0)
        kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask,
                     other=0.0)
        wb = tl.load(W + tok[:, None] * (HV * KD) + hv * KD + ck[None, :], mask=kmask,
                     other=0.0)
        dob = tl.load(DO + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask,
                      other=0.0).to(DT)
        gc = tl.load(GCUM + tok * HV + hv, mask=tmask, other=0.0)
        g_last = tl.load(GCUM + last * HV + hv)

        # the local part, from gdn_bwd_dv_local_kernel; this program overwrites it below
        dv = tl.load(DVNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask,
                     other=0.0).to(tl.float32)
        kdec = (kb * tl.exp(tl.where(tmask, g_last - gc, 0.0))[:, None]).to(DT)
        dv = tl.dot(kdec, ds.to(DT), dv, input_precision=PREC)
        dv = dv.to(DVNEW.dtype.element_ty)
        tl.store(DVNEW + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], dv, mask=vmask)

        qo = tl.zeros([BK, BV], dtype=tl.float32)
        qo = tl.dot(tl.trans((qb * tl.exp(gc)[:, None]).to(DT)), dob, qo, input_precision=PREC)
        wd = tl.zeros([BK, BV], dtype=tl.float32)
        wd = tl.dot(tl.trans(wb.to(DT)), dv.to(DT), wd, input_precision=PREC)
        ds = ds * tl.exp(g_last) + qo * scale - wd

    if STORE_DH0:
        tl.store(DH0 + (n * HV + hv) * KD * VD + s_off, ds, mask=smask)
