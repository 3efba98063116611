"""Per-sequence kernels: the final state (forward) and d(initial_state) (backward).

One program per (sequence, channel block); empty sequences are handled like any other
(their final state is their initial state, or 0).
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import (
    pre_activation,
    round_bf16,
    silu_grad,
    x_window,
)


@triton.jit(do_not_specialize=["T"])
def causal_conv1d_final_state_kernel(
    X, H0, FS, CU,
    T, D, stride_xb, stride_xt, s_hn, s_hd, s_hk,
    W: tl.constexpr, BW: tl.constexpr, HAS_H0: tl.constexpr, VARLEN: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """FS[n, c, j] = the input at position L - (W - 1) + j (x, else the initial state's
    slot L + j, else 0): a copy in x's dtype, no arithmetic."""
    n = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    if VARLEN:
        bos = tl.load(CU + n).to(tl.int64)
        L = tl.load(CU + n + 1).to(tl.int64) - bos
        x_off = bos * stride_xt
    else:
        L = T
        x_off = n * stride_xb
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    slot = tl.arange(0, BW).to(tl.int64)
    p = L - (W - 1) + slot
    m = (slot < W - 1)[:, None] & cmask[None, :]
    xin = m & (p >= 0)[:, None]
    v = tl.load(X + x_off + p[:, None] * stride_xt + cols[None, :], mask=xin, other=0.0)
    if HAS_H0:
        hin = m & (p < 0)[:, None]
        h = tl.load(H0 + n * s_hn + cols[None, :] * s_hd + (p + (W - 1))[:, None] * s_hk,
                    mask=hin, other=0.0)
        v = tl.where(hin, h, v)
    tl.store(FS + n * D * (W - 1) + cols[None, :] * (W - 1) + slot[:, None],
             v.to(FS.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["T"])
def causal_conv1d_dh0_kernel(
    X, WT, BIAS, H0, DY, DHT, DH0, CU,
    T, D, stride_xb, stride_xt, stride_w, s_hn, s_hd, s_hk, stride_dyb, stride_dyt,
    s_tn, s_td, s_tk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """DH0[n, c, k] (slot k is position k - (W - 1)) = sum_j weight[c, j] * dpre[k - j]
    over the outputs 0 <= k - j < L that read it (j = 0, 1, ... in order), plus
    DHT[n, c, k - L] when the slot is still inside the final state (k >= L). dpre is
    recomputed (pre-activation from x and the initial state)."""
    n = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    if VARLEN:
        bos = tl.load(CU + n).to(tl.int64)
        L = tl.load(CU + n + 1).to(tl.int64) - bos
        x_off = bos * stride_xt
        dy_off = bos * stride_dyt
    else:
        L = T
        x_off = n * stride_xb
        dy_off = n * stride_dyb
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    k = tl.arange(0, BW).to(tl.int64)
    kmask = k < W - 1
    taps = tl.arange(0, BW)
    w2 = tl.load(WT + cols[None, :] * stride_w + taps[:, None],
                 mask=(taps < W)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc = tl.zeros([BW, BLOCK_D], dtype=tl.float32)
    for j in tl.static_range(W):
        u = k - j
        m = (kmask & (u >= 0) & (u < L))[:, None] & cmask[None, :]
        dpre = tl.load(DY + dy_off + u[:, None] * stride_dyt + cols[None, :], mask=m,
                       other=0.0).to(tl.float32)
        if SILU:
            win = x_window(X, H0, x_off, n, u, L, cols, cmask, stride_xt, s_hn, s_hd, s_hk,
                           W, BW, True)
            dpre = silu_grad(dpre, pre_activation(win, w2, b))
        wj = tl.load(WT + cols * stride_w + j, mask=cmask, other=0.0).to(tl.float32)
        acc += dpre * wj[None, :]
    if HAS_DHT:
        m = (kmask & (k >= L))[:, None] & cmask[None, :]
        acc += tl.load(DHT + n * s_tn + cols[None, :] * s_td + (k - L)[:, None] * s_tk,
                       mask=m, other=0.0).to(tl.float32)
    if RNE:
        acc = round_bf16(acc)
    tl.store(DH0 + n * D * (W - 1) + cols[None, :] * (W - 1) + k[:, None],
             acc.to(DH0.dtype.element_ty), mask=kmask[:, None] & cmask[None, :])
