"""Chunk prep of the forward, one program per (chunk, value head).

For the chunk's tokens i, j (rows of one 64-token chunk, ``G`` the within-chunk cumulative
sum of g, ``M`` the strictly lower mask):

    A_raw = M * beta_i (k_i . k_j) exp(G_i - G_j)
    T     = (I + A_raw)^-1            (recursive block doubling, log2(BT) steps)
    w     = T @ (beta * exp(G) * k)
    u     = T @ (beta * v)

(with ``LOAD_A``, the backward's recompute, T is loaded from the forward's instead), so the
chunk's delta-rule corrections are ``u - w @ S0`` for the state S0 at the chunk's
start (the WY/UT form). k k^T, w and u are dots of ``DT`` operands (the inputs' dtype on
CUDA, fp32 under the interpreter) with fp32 accumulation; the solve is fp32 at ``PREC``.
The exponent is masked before exp so the upper triangle never overflows. Stores G
``[NT, HV]`` (fp32), and T ``[NT, HV, BT]``, w ``[NT, HV, K]``, u ``[NT, HV, V]`` in their
buffers' dtypes (rows past the chunk's end are not stored). No atomics: each program writes
only its own chunk's rows.
"""

import triton
import triton.language as tl
from cake_core.triangular import unit_lower_inverse


@triton.jit
def gdn_fwd_prep_kernel(
    Kp, Vp, Gp, BETA, CHUNK_START, CHUNK_END,
    GCUM, Ap, W, U,
    H: tl.constexpr, HV: tl.constexpr, GROUP: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, LOG2_BT: tl.constexpr,
    BK: tl.constexpr, BVF: tl.constexpr, LOAD_A: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    ck = tl.arange(0, BK)
    cv = tl.arange(0, BVF)
    kmask = tmask[:, None] & (ck < KD)[None, :]
    vmask = tmask[:, None] & (cv < VD)[None, :]

    g = tl.load(Gp + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, axis=0)
    kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :], mask=kmask, other=0.0)
    vb = tl.load(Vp + tok[:, None] * (HV * VD) + hv * VD + cv[None, :], mask=vmask, other=0.0)

    a_ptr = Ap + tok[:, None] * (HV * BT) + hv * BT + rows[None, :]
    if LOAD_A:  # the backward, with the T its forward kept
        tm = tl.load(a_ptr, mask=tmask[:, None], other=0.0).to(tl.float32)
    else:
        kkt = tl.zeros([BT, BT], dtype=tl.float32)
        kkt = tl.dot(kb.to(DT), tl.trans(kb.to(DT)), kkt, input_precision=PREC)
        # rows past the chunk's end are masked too: their G (0) would overflow exp(Gi - Gj)
        lower = (rows[:, None] > rows[None, :]) & tmask[:, None]
        decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0))
        a_raw = tl.where(lower, beta[:, None] * kkt * decay, 0.0)

        tm = unit_lower_inverse(a_raw, BT, LOG2_BT, PREC)  # T = (I + a_raw)^-1
        # rounded to A's dtype before use, so a backward that loads the kept T computes
        # w and u from the same values as one that recomputes it (same bits either way)
        tm = tm.to(Ap.dtype.element_ty).to(tl.float32)
        tl.store(a_ptr, tm.to(Ap.dtype.element_ty), mask=tmask[:, None])

    w = tl.zeros([BT, BK], dtype=tl.float32)
    w = tl.dot(tm.to(DT), (kb * (beta * tl.exp(gc))[:, None]).to(DT), w, input_precision=PREC)
    u = tl.zeros([BT, BVF], dtype=tl.float32)
    u = tl.dot(tm.to(DT), (vb * beta[:, None]).to(DT), u, input_precision=PREC)

    tl.store(GCUM + tok * HV + hv, gc, mask=tmask)
    tl.store(W + tok[:, None] * (HV * KD) + hv * KD + ck[None, :],
             w.to(W.dtype.element_ty), mask=kmask)
    tl.store(U + tok[:, None] * (HV * VD) + hv * VD + cv[None, :],
             u.to(U.dtype.element_ty), mask=vmask)
