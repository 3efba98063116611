"""Forward: y = act(bias + sum_j weight[:, j] * x[t - W + 1 + j]) on one tile per program,
and each sequence's final state.

Program (g, cb) owns token block g (``BLOCK_T`` tokens of one sequence; fixed length:
sequence g // n_blk_seq, varlen: row g of a host-built (sequence, start) table; every
sequence has at least one block, an empty one has one block of masked rows) and channel
block cb. It reads the W - 1 halo rows before its block from x of the same sequence, else
from the initial state, else 0, one [BLOCK_T, BLOCK_D] tap at a time (order: common.py).
The program of a sequence's last block also writes its final state (a copy of the last
W - 1 inputs, in x's dtype, no arithmetic).
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import round_bf16


@triton.jit(do_not_specialize=["T", "n_blk_seq"])
def causal_conv1d_fwd_kernel(
    X, WT, BIAS, H0, Y, FS, TABLE, CU,
    T, D, n_blk_seq, stride_xb, stride_xt, stride_w, stride_wk, s_hn, s_hd, s_hk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_FS: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
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
    rows = start + tl.arange(0, BLOCK_T).to(tl.int64)
    y = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    xp = X + x_off + rows[:, None] * stride_xt + cols[None, :]
    for i in tl.static_range(W):  # tap i reads position t - (W - 1) + i
        p = rows + (i - (W - 1))
        xi = tl.load(xp + (i - (W - 1)) * stride_xt,
                     mask=((p >= 0) & (p < L))[:, None] & cmask[None, :], other=0.0)
        wi = tl.load(WT + cols * stride_w + i * stride_wk, mask=cmask,
                     other=0.0).to(tl.float32)
        y += wi[None, :] * xi.to(tl.float32)
    if HAS_H0:
        if start < W - 1:  # rows that reach before the sequence start: the state's taps
            for h_i in tl.static_range(W):
                h_p = rows + (h_i - (W - 1))
                h_v = tl.load(H0 + n * s_hn + cols[None, :] * s_hd
                              + (h_p + (W - 1))[:, None] * s_hk,
                              mask=(h_p < 0)[:, None] & cmask[None, :], other=0.0)
                h_w = tl.load(WT + cols * stride_w + h_i * stride_wk, mask=cmask,
                              other=0.0).to(tl.float32)
                y += h_w[None, :] * h_v.to(tl.float32)
    if SILU:
        y = y / (1.0 + tl.exp(-y))
    if RNE:
        y = round_bf16(y)
    mask = (rows < L)[:, None] & cmask[None, :]
    tl.store(Y + y_off + rows[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
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
