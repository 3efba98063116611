"""Backward: dx per tile, and one fp32 partial dweight / dbias row per token block.

Program (g, cb) owns token block g (as in the forward) and channel block cb. For the W
output shifts k = 0, 1, ..., W - 1 in order it recomputes the pre-activation at t + k from
a [BLOCK_T, BW, BLOCK_D] window of x (and the initial state), forms
dpre = dy * act'(pre) (outputs past the sequence end give 0), and adds
weight[:, W - 1 - k] * dpre[t + k] to dx[t]; then the gradient that reached the final state
(rows among the sequence's last W - 1). The k = 0 terms also give the block's partial
dweight[c, i] = sum_t dpre[t] * input[t - (W - 1) + i] and dbias[c] = sum_t dpre[t],
written to DWP[g] / DBP[g]; the host sums the partials over g in index order
(cake_core.gemm.ordered_sum). No atomics.
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import (
    pre_activation,
    round_bf16,
    silu_grad,
    x_window,
)


@triton.jit(do_not_specialize=["T", "n_blk_seq"])
def causal_conv1d_bwd_kernel(
    X, WT, BIAS, H0, DY, DHT, DX, DWP, DBP, TABLE, CU,
    T, D, n_blk_seq, stride_xb, stride_xt, stride_w, s_hn, s_hd, s_hk,
    stride_dyb, stride_dyt, s_tn, s_td, s_tk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
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
        dy_off = bos * stride_dyt
        dx_off = bos * D
    else:
        n = g // n_blk_seq
        start = (g - n * n_blk_seq) * BLOCK_T
        L = T
        x_off = n * stride_xb
        dy_off = n * stride_dyb
        dx_off = n * T * D
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    taps = tl.arange(0, BW)
    tmask = (taps < W)[:, None] & cmask[None, :]
    w2 = tl.load(WT + cols[None, :] * stride_w + taps[:, None], mask=tmask,
                 other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BLOCK_D], dtype=tl.float32)
    rows = start + tl.arange(0, BLOCK_T).to(tl.int64)
    dx = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(W):
        u = rows + k
        um = (u < L)[:, None] & cmask[None, :]
        dpre = tl.load(DY + dy_off + u[:, None] * stride_dyt + cols[None, :], mask=um,
                       other=0.0).to(tl.float32)
        if SILU or k == 0:
            win = x_window(X, H0, x_off, n, u, L, cols, cmask, stride_xt, s_hn, s_hd, s_hk,
                           W, BW, HAS_H0)
        if SILU:
            dpre = silu_grad(dpre, pre_activation(win, w2, b))
        if k == 0:
            dw = tl.sum(dpre[:, None, :] * win, axis=0)
            tl.store(DWP + g * D * W + cols[None, :] * W + taps[:, None], dw, mask=tmask)
            if HAS_BIAS:
                tl.store(DBP + g * D + cols, tl.sum(dpre, axis=0), mask=cmask)
        wk = tl.load(WT + cols * stride_w + (W - 1 - k), mask=cmask, other=0.0).to(tl.float32)
        dx += dpre * wk[None, :]
    if HAS_DHT:
        j = rows - L + (W - 1)
        m = ((j >= 0) & (rows < L))[:, None] & cmask[None, :]
        dx += tl.load(DHT + n * s_tn + cols[None, :] * s_td + j[:, None] * s_tk, mask=m,
                      other=0.0).to(tl.float32)
    if RNE:
        dx = round_bf16(dx)
    mask = (rows < L)[:, None] & cmask[None, :]
    tl.store(DX + dx_off + rows[:, None] * D + cols[None, :], dx.to(DX.dtype.element_ty),
             mask=mask)
