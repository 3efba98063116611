"""Forward: y = act(bias + sum_j weight[:, j] * x[t - W + 1 + j]) on one tile per program.

Program (g, cb) owns token block g (``BLOCK_T`` tokens of one sequence; fixed length:
sequence g // n_blk_seq, varlen: row g of a host-built (sequence, start) table) and channel
block cb. It reads the W - 1 halo rows before its block from x of the same sequence, else
from the initial state, else 0: the window is loaded as one [BLOCK_T, BW, BLOCK_D] tile.
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import pre_activation, round_bf16, x_window


@triton.jit(do_not_specialize=["T", "n_blk_seq"])
def causal_conv1d_fwd_kernel(
    X, WT, BIAS, H0, Y, TABLE, CU,
    T, D, n_blk_seq, stride_xb, stride_xt, stride_w, s_hn, s_hd, s_hk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    g = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    if VARLEN:
        n = tl.load(TABLE + 2 * g).to(tl.int64)
        start = tl.load(TABLE + 2 * g + 1).to(tl.int64)
        bos = tl.load(CU + n).to(tl.int64)
        L = tl.load(CU + n + 1).to(tl.int64) - bos
        x_off = bos * stride_xt
        y_off = bos * D
    else:
        n = g // n_blk_seq
        start = (g - n * n_blk_seq) * BLOCK_T
        L = T
        x_off = n * stride_xb
        y_off = n * T * D
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    taps = tl.arange(0, BW)
    w2 = tl.load(WT + cols[None, :] * stride_w + taps[:, None],
                 mask=(taps < W)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BLOCK_D], dtype=tl.float32)
    rows = start + tl.arange(0, BLOCK_T).to(tl.int64)
    win = x_window(X, H0, x_off, n, rows, L, cols, cmask, stride_xt, s_hn, s_hd, s_hk,
                   W, BW, HAS_H0)
    y = pre_activation(win, w2, b)
    if SILU:
        y = y * tl.sigmoid(y)
    if RNE:
        y = round_bf16(y)
    mask = (rows < L)[:, None] & cmask[None, :]
    tl.store(Y + y_off + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
