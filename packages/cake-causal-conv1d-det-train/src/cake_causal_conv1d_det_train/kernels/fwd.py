"""Forward: y = act(bias + sum_j weight[:, j] * x[t - W + 1 + j]) on one tile per program,
and each sequence's final state.

Program (g, cb) owns token block g (``BLOCK_T`` tokens of one sequence; fixed length:
sequence g // n_blk_seq, varlen: row g of a host-built (sequence, start) table; every
sequence has at least one block, an empty one has one block of masked rows) and channel
block cb. It reads the W - 1 halo rows before its block from x of the same sequence, else
from the initial state, else 0, one [BLOCK_T, BLOCK_D] tap at a time (order: common.py).
The program of a sequence's last block also writes its final state (a copy of the last
W - 1 inputs, in x's dtype, no arithmetic).

The block is computed in sub-tiles of ``SUB_T`` rows (a power of two dividing BLOCK_T; the
launcher's choice, not a plan field), each stored before the next one's loads: every element
gets the same sum in the same order whatever SUB_T (the same bits), but ptxas can no longer
keep the whole block's W shifted x tiles in flight at once (loads are not moved above a
store to a pointer that may alias), so fewer registers are live and more programs fit per SM
(measurements: docs/benchmarks/causal_conv1d.md).
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import (
    add_state_taps,
    add_x_taps,
    block_origin,
    round_bf16,
)


@triton.jit(do_not_specialize=["T", "n_blk_seq"])
def causal_conv1d_fwd_kernel(
    X, WT, BIAS, H0, Y, FS, TABLE, CU,
    T, D, n_blk_seq, stride_xb, stride_xt, stride_w, stride_wk, s_hn, s_hd, s_hk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_FS: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, SUB_T: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    n, start, L, x_off, _, y_off = block_origin(g, TABLE, CU, T, D, n_blk_seq, stride_xb,
                                                stride_xt, stride_xb, stride_xt, VARLEN,
                                                BLOCK_T)
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    # the block in sub-tiles of SUB_T rows, each stored before the next one's loads: the same
    # per-element sums (the same bits), fewer registers (module docstring)
    for h in tl.static_range(BLOCK_T // SUB_T):
        rows = start + h * SUB_T + tl.arange(0, SUB_T).to(tl.int64)
        y = tl.zeros([SUB_T, BLOCK_D], dtype=tl.float32)
        if HAS_BIAS:
            y += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        xp = X + x_off + rows[:, None] * stride_xt + cols[None, :]
        # tap i reads position t - (W - 1) + i
        y = add_x_taps(y, xp, 0, rows, L, WT, cols, cmask, stride_xt, stride_w, stride_wk, W)
        if HAS_H0:
            if start + h * SUB_T < W - 1:  # rows that reach before the sequence start
                y = add_state_taps(y, H0, WT, n, rows, rows, cols, cmask, s_hn, s_hd, s_hk,
                                   stride_w, stride_wk, W, False)
        if SILU:
            y = y / (1.0 + tl.exp(-y))
        if RNE:
            y = round_bf16(y)
        mask = (rows < L)[:, None] & cmask[None, :]
        tl.store(Y + y_off + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=mask)
    if HAS_FS:
        if start + BLOCK_T >= L:  # the sequence's last block: FS[n, c, j] = input L-W+1+j
            f_slot = tl.arange(0, BW).to(tl.int64)
            f_p = L - (W - 1) + f_slot
            f_m = (f_slot < W - 1)[:, None] & cmask[None, :]
            f_v = tl.load(X + x_off + f_p[:, None] * stride_xt + cols[None, :],
                          mask=f_m & (f_p >= 0)[:, None], other=0.0)
            if HAS_H0:
                f_hin = f_m & (f_p < 0)[:, None]
                f_h = tl.load(H0 + n * s_hn + cols[None, :] * s_hd
                              + (f_p + (W - 1))[:, None] * s_hk, mask=f_hin, other=0.0)
                f_v = tl.where(f_hin, f_h, f_v)
            tl.store(FS + n * D * (W - 1) + cols[None, :] * (W - 1) + f_slot[:, None],
                     f_v.to(FS.dtype.element_ty), mask=f_m)
