"""Each chunk's T = (I + A_raw)^-1 in a kernel of its own (plan ``inv_kernel = 1``).

One program per (chunk, value head), before the chunk prep, which then loads T as the
backward does (``LOAD_A``). With ``G`` the within-chunk cumulative sum of g, ``M`` the
strictly lower mask and the chunk's rows in four blocks of ``BC = 16``:

    A_raw = M * beta_i (k_i . k_j) exp(G_i - G_j)       (the prep's ops: one 64 x 64 tile)
    T_rr  = (I + A_rr)^-1                                (doubling, on 16 x 16 tiles)
    T_rc  = -T_rr sum_{c <= m < r} A_rm T_mc             (r > c, in the order c, c + 1, ...)

the block merge of FLA's ``solve_tril`` (fla/ops/utils/solve_tril.py), as KDA's
``inv_kernel = 2``: 16 dots of ``16^3`` after the diagonal blocks' own, in place of the
whole tile's six doubling steps of ``64^3`` (the form that cost KDA's forward prep ~580 us
of its 913 at a benchmark case on an H200, session 21). A_raw is formed as the prep forms
it (k k^T a dot of ``DT`` operands, G the same ``tl.cumsum``; on a GPU the two kernels'
builds, with other warp counts, may still round differently: fixed per plan either way),
written to the fp32 scratch ``AS`` ``[NT, HV, BT]`` (the chunk's rows) and read back as
``[BC, BC]`` blocks after a barrier (blocks of a register tile cannot be addressed; an
offline sm_90 build that formed each block pair's k k^T apart spilled ~1.2 KB per thread).
The exponent is masked before exp (no overflow in the upper triangle or past the chunk's
end). T is stored in A's dtype, upper blocks as zeros; rows past the chunk's end are
neither written nor read. No atomics: each program writes only its own rows.
"""

import triton
import triton.language as tl
from cake_core.triangular import unit_lower_inverse


@triton.jit
def _a_block(AS, start, end, hv, HV, R: tl.constexpr, C: tl.constexpr, BT: tl.constexpr,
             BC: tl.constexpr):
    """Block (R, C) (``[BC, BC]``, R >= C) of the stored A_raw; rows past the end 0."""
    r = tl.arange(0, BC)
    tok = start + R * BC + r
    return tl.load(AS + tok[:, None] * (HV * BT) + hv * BT + C * BC + r[None, :],
                   mask=(tok < end)[:, None], other=0.0)


@triton.jit
def _t_store(Ap, t, start, end, hv, HV, R: tl.constexpr, C: tl.constexpr, BT: tl.constexpr,
             BC: tl.constexpr):
    r = tl.arange(0, BC)
    tok = start + R * BC + r
    tl.store(Ap + tok[:, None] * (HV * BT) + hv * BT + C * BC + r[None, :],
             t.to(Ap.dtype.element_ty), mask=(tok < end)[:, None])


@triton.jit
def gdn_fwd_inv_kernel(
    Kp, Gp, BETA, CHUNK_START, CHUNK_END, AS, Ap,
    H, HV, GROUP, KD,
    DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    LOG2_BC: tl.constexpr, BK: tl.constexpr,
):
    """T of chunk ``program_id(0)`` and value head ``program_id(1)`` into ``Ap``
    ``[NT, HV, BT]`` (module docstring). Kp: k ``[NT, H, KD]``; Gp, BETA: ``[NT, HV]``;
    AS: fp32 scratch ``[NT, HV, BT]``."""
    tl.static_assert(BT == 4 * BC, "the merge takes four diagonal blocks")
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUP
    start = tl.load(CHUNK_START + c).to(tl.int64)
    end = tl.load(CHUNK_END + c).to(tl.int64)
    rows = tl.arange(0, BT)
    tok = start + rows
    tmask = tok < end
    ck = tl.arange(0, BK)
    g = tl.load(Gp + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    beta = tl.load(BETA + tok * HV + hv, mask=tmask, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, axis=0)
    kb = tl.load(Kp + tok[:, None] * (H * KD) + hk * KD + ck[None, :],
                 mask=tmask[:, None] & (ck < KD)[None, :], other=0.0)
    kkt = tl.zeros([BT, BT], dtype=tl.float32)
    kkt = tl.dot(kb.to(DT), tl.trans(kb.to(DT)), kkt, input_precision=PREC)
    lower = (rows[:, None] > rows[None, :]) & tmask[:, None]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0))
    a_raw = tl.where(lower, beta[:, None] * kkt * decay, 0.0)
    tl.store(AS + tok[:, None] * (HV * BT) + hv * BT + rows[None, :], a_raw,
             mask=tmask[:, None])
    tl.debug_barrier()  # the blocks below are read by other threads than wrote them

    t00 = unit_lower_inverse(_a_block(AS, start, end, hv, HV, 0, 0, BT, BC), BC, LOG2_BC,
                             PREC)
    t11 = unit_lower_inverse(_a_block(AS, start, end, hv, HV, 1, 1, BT, BC), BC, LOG2_BC,
                             PREC)
    t22 = unit_lower_inverse(_a_block(AS, start, end, hv, HV, 2, 2, BT, BC), BC, LOG2_BC,
                             PREC)
    t33 = unit_lower_inverse(_a_block(AS, start, end, hv, HV, 3, 3, BT, BC), BC, LOG2_BC,
                             PREC)
    a10 = _a_block(AS, start, end, hv, HV, 1, 0, BT, BC)
    a21 = _a_block(AS, start, end, hv, HV, 2, 1, BT, BC)
    a32 = _a_block(AS, start, end, hv, HV, 3, 2, BT, BC)
    t10 = -tl.dot(t11, tl.dot(a10, t00, input_precision=PREC), input_precision=PREC)
    t21 = -tl.dot(t22, tl.dot(a21, t11, input_precision=PREC), input_precision=PREC)
    t32 = -tl.dot(t33, tl.dot(a32, t22, input_precision=PREC), input_precision=PREC)
    a20 = _a_block(AS, start, end, hv, HV, 2, 0, BT, BC)
    s20 = tl.dot(a20, t00, input_precision=PREC)
    s20 = tl.dot(a21, t10, s20, input_precision=PREC)
    t20 = -tl.dot(t22, s20, input_precision=PREC)
    a31 = _a_block(AS, start, end, hv, HV, 3, 1, BT, BC)
    s31 = tl.dot(a31, t11, input_precision=PREC)
    s31 = tl.dot(a32, t21, s31, input_precision=PREC)
    t31 = -tl.dot(t33, s31, input_precision=PREC)
    a30 = _a_block(AS, start, end, hv, HV, 3, 0, BT, BC)
    s30 = tl.dot(a30, t00, input_precision=PREC)
    s30 = tl.dot(a31, t10, s30, input_precision=PREC)
    s30 = tl.dot(a32, t20, s30, input_precision=PREC)
    t30 = -tl.dot(t33, s30, input_precision=PREC)

    z = tl.zeros([BC, BC], dtype=tl.float32)
    _t_store(Ap, t00, start, end, hv, HV, 0, 0, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 0, 1, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 0, 2, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 0, 3, BT, BC)
    _t_store(Ap, t10, start, end, hv, HV, 1, 0, BT, BC)
    _t_store(Ap, t11, start, end, hv, HV, 1, 1, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 1, 2, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 1, 3, BT, BC)
    _t_store(Ap, t20, start, end, hv, HV, 2, 0, BT, BC)
    _t_store(Ap, t21, start, end, hv, HV, 2, 1, BT, BC)
    _t_store(Ap, t22, start, end, hv, HV, 2, 2, BT, BC)
    _t_store(Ap, z, start, end, hv, HV, 2, 3, BT, BC)
    _t_store(Ap, t30, start, end, hv, HV, 3, 0, BT, BC)
    _t_store(Ap, t31, start, end, hv, HV, 3, 1, BT, BC)
    _t_store(Ap, t32, start, end, hv, HV, 3, 2, BT, BC)
    _t_store(Ap, t33, start, end, hv, HV, 3, 3, BT, BC)
