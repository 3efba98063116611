"""Backward: dx per tile, d(initial_state) per sequence, and one fp32 partial dweight / dbias
row per token block.

Program (g, cb) owns token block g (as in the forward; every sequence has at least one
block) and channel block cb. For the W output shifts k = 0, 1, ..., W - 1 in order it
recomputes the pre-activation at t + k tap by tap, exactly as the forward did (common.py;
the pre-activation is not saved), forms dpre = dy * act'(pre) (outputs past the sequence end
give 0), and adds weight[:, W - 1 - k] * dpre[t + k] to dx[t]; then the gradient that
reached the final state (rows among the sequence's last W - 1).

Partials of the block, written to DWP[g] / DBP[g] and summed over g in index order by the
host (cake_core.gemm.ordered_sum): dbias[c] = sum over the block's outputs of dpre, and
dweight[c, W - 1 - k] = sum over the block's inputs x[t] of dpre[t + k] * x[t] (each
(output, input) pair is counted by the block that holds the input); the pairs whose input
is in the initial state are added by the sequence's first block, which also writes
d(initial_state). No atomics.

WINDOW (plan.bwd_window, SiLU, W <= 4): the same sums, with each of the 2W - 1 shifted x
tiles loaded once (_bwd_window_taps). The weight is read through two strides (channel, tap):
the ``[D, W]`` weight or its ``[W, D]`` copy (plan.weight_tap_major).
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import (
    add_state_taps,
    add_x_taps,
    block_origin,
    round_bf16,
    silu_grad,
    state_grads,
)


@triton.jit
def _bwd_window_step(k, pre, dpre_raw, x_own, dx, dw, b, WT, H0, DBP, rows, cols, cmask, taps,
                     g, n, start, D, stride_w, stride_wk, s_hn, s_hd, s_hk,
                     W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr):
    """Output shift k of the window backward: ``pre`` (the x taps of pre[t + k], summed)
    gets the state's taps where they reach (first blocks only), then dpre, the dbias
    partial (k = 0), dweight tap W - 1 - k and dx, exactly as the per-shift loop."""
    u = rows + k
    if HAS_H0:
        if start + k < W - 1:
            pre = add_state_taps(pre, H0, WT, n, u, u, cols, cmask, s_hn, s_hd, s_hk,
                                 stride_w, stride_wk, W, False)
    dpre = silu_grad(dpre_raw, pre)
    if k == 0:
        if HAS_BIAS:
            tl.store(DBP + g * D + cols, tl.sum(dpre, axis=0), mask=cmask)
    dw += tl.where((taps == W - 1 - k)[:, None], tl.sum(dpre * x_own, axis=0)[None, :], 0.0)
    wk = tl.load(WT + cols * stride_w + (W - 1 - k) * stride_wk, mask=cmask,
                 other=0.0).to(tl.float32)
    dx += dpre * wk[None, :]
    return dx, dw


@triton.jit
def _bwd_window_taps(X, WT, H0, DY, DBP, b, x_own, xp, dyp, rows, cols, cmask, taps, dx, dw,
                     g, n, start, L, D, stride_xt, stride_w, stride_wk, stride_dyt, s_hn,
                     s_hd, s_hk,
                     W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """The SiLU backward's W output shifts with each of the 2W - 1 shifted x tiles (row
    offsets -(W - 1) .. W - 1) loaded once: tile s feeds tap i = s - k of the pre-activation
    at shift k, for every k it reaches. Per shift the taps still arrive in the order
    i = 0, 1, ..., W - 1 (bias first, the state's taps last), so each pre[t + k] is the same
    sum as in the forward and the per-shift loop; shift k is finished (dpre, dweight, dx, in
    the order k = 0, 1, ...) as soon as its last x tap is in. W <= 4: one accumulator per
    shift."""
    p0 = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    p1 = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    p2 = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    p3 = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        p0 += b[None, :]
        p1 += b[None, :]
        p2 += b[None, :]
        p3 += b[None, :]
    for s in tl.static_range(2 * W - 1):
        sh = s - (W - 1)  # row offset of this x tile
        p = rows + sh
        xs = tl.load(xp + sh * stride_xt, mask=((p >= 0) & (p < L))[:, None] & cmask[None, :],
                     other=0.0).to(tl.float32)
        # tap i = s - k of shift k, for 0 <= i < W and 0 <= k < W
        if s < W:
            p0 += tl.load(WT + cols * stride_w + s * stride_wk, mask=cmask,
                          other=0.0).to(tl.float32)[None, :] * xs
        if s >= 1 and s - 1 < W and W > 1:
            p1 += tl.load(WT + cols * stride_w + (s - 1) * stride_wk, mask=cmask,
                          other=0.0).to(tl.float32)[None, :] * xs
        if s >= 2 and s - 2 < W and W > 2:
            p2 += tl.load(WT + cols * stride_w + (s - 2) * stride_wk, mask=cmask,
                          other=0.0).to(tl.float32)[None, :] * xs
        if s >= 3 and s - 3 < W and W > 3:
            p3 += tl.load(WT + cols * stride_w + (s - 3) * stride_wk, mask=cmask,
                          other=0.0).to(tl.float32)[None, :] * xs
        kd = s - (W - 1)  # the shift whose last tap this was
        if kd >= 0:
            dpre_raw = tl.load(dyp + kd * stride_dyt,
                               mask=((rows + kd) < L)[:, None] & cmask[None, :],
                               other=0.0).to(tl.float32)
            if kd == 0:
                pre = p0
            elif kd == 1:
                pre = p1
            elif kd == 2:
                pre = p2
            else:
                pre = p3
            dx, dw = _bwd_window_step(kd, pre, dpre_raw, x_own, dx, dw, b, WT, H0, DBP, rows,
                                      cols, cmask, taps, g, n, start, D, stride_w, stride_wk,
                                      s_hn, s_hd, s_hk, W, HAS_BIAS, HAS_H0)
    return dx, dw


@triton.jit(do_not_specialize=["T", "n_blk_seq"])
def causal_conv1d_bwd_kernel(
    X, WT, BIAS, H0, DY, DHT, DX, DH0, DWP, DBP, TABLE, CU,
    T, D, n_blk_seq, stride_xb, stride_xt, stride_w, stride_wk, s_hn, s_hd, s_hk,
    stride_dyb, stride_dyt, s_tn, s_td, s_tk,
    W: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr = 0,
):
    g = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    n, start, L, x_off, dy_off, dx_off = block_origin(g, TABLE, CU, T, D, n_blk_seq,
                                                      stride_xb, stride_xt, stride_dyb,
                                                      stride_dyt, VARLEN, BLOCK_T)
    cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    if HAS_BIAS:
        b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        b = tl.zeros([BLOCK_D], dtype=tl.float32)  # never added (HAS_BIAS guards every use)
    rows = start + tl.arange(0, BLOCK_T).to(tl.int64)
    taps = tl.arange(0, BW)
    xp = X + x_off + rows[:, None] * stride_xt + cols[None, :]
    dyp = DY + dy_off + rows[:, None] * stride_dyt + cols[None, :]
    x_own = tl.load(xp, mask=(rows < L)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    dx = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    dw = tl.zeros([BW, BLOCK_D], dtype=tl.float32)
    if SILU and WINDOW:  # 2W - 1 shifted x tiles instead of W^2 (W <= 4; plan.bwd_window)
        dx, dw = _bwd_window_taps(X, WT, H0, DY, DBP, b, x_own, xp, dyp, rows, cols, cmask,
                                  taps, dx, dw, g, n, start, L, D, stride_xt, stride_w,
                                  stride_wk, stride_dyt, s_hn, s_hd, s_hk, W, HAS_BIAS, HAS_H0,
                                  BLOCK_T, BLOCK_D)
    for k in tl.static_range(W if not (SILU and WINDOW) else 0):
        u = rows + k
        dpre = tl.load(dyp + k * stride_dyt, mask=(u < L)[:, None] & cmask[None, :],
                       other=0.0).to(tl.float32)
        if SILU:  # recompute pre[t + k] as the forward did
            pre = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
            if HAS_BIAS:
                pre += b[None, :]
            pre = add_x_taps(pre, xp, k, u, L, WT, cols, cmask, stride_xt, stride_w,
                             stride_wk, W)
            if HAS_H0:
                if start + k < W - 1:
                    pre = add_state_taps(pre, H0, WT, n, u, u, cols, cmask, s_hn, s_hd,
                                         s_hk, stride_w, stride_wk, W, False)
            dpre = silu_grad(dpre, pre)
        if k == 0:
            if HAS_BIAS:
                tl.store(DBP + g * D + cols, tl.sum(dpre, axis=0), mask=cmask)
        # x[t] is tap W - 1 - k of the output t + k
        dw += tl.where((taps == W - 1 - k)[:, None], tl.sum(dpre * x_own, axis=0)[None, :], 0.0)
        wk = tl.load(WT + cols * stride_w + (W - 1 - k) * stride_wk, mask=cmask,
                     other=0.0).to(tl.float32)
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
    if HAS_H0:
        if start == 0:  # the sequence's first block: d(initial_state)
            # DH0[n, c, k] (slot k is position k - (W - 1)) = sum_u weight[c, k - u] * dpre[u]
            # over the outputs u = 0 .. W - 2 that read it (0 <= k - u < W, u < L), plus
            # DHT[n, c, k - L] when the slot is still inside the final state (k >= L).
            h_r = tl.arange(0, BW).to(tl.int64)  # slot k of the state, or output u
            h_rmask = h_r < W - 1
            h_dpre = tl.load(DY + dy_off + h_r[:, None] * stride_dyt + cols[None, :],
                             mask=(h_rmask & (h_r < L))[:, None] & cmask[None, :],
                             other=0.0).to(tl.float32)
            if SILU:  # pre at outputs u = 0 .. W - 2, in the forward's order
                h_pre = tl.zeros([BW, BLOCK_D], dtype=tl.float32)
                if HAS_BIAS:
                    h_pre += b[None, :]
                for h_i in tl.static_range(W):
                    h_p = h_r + (h_i - (W - 1))
                    h_x = tl.load(X + x_off + h_p[:, None] * stride_xt + cols[None, :],
                                  mask=((h_p >= 0) & (h_p < L))[:, None] & cmask[None, :],
                                  other=0.0)
                    h_w = tl.load(WT + cols * stride_w + h_i * stride_wk, mask=cmask,
                                  other=0.0).to(tl.float32)
                    h_pre += h_w[None, :] * h_x.to(tl.float32)
                h_pre = add_state_taps(h_pre, H0, WT, n, h_r, h_r, cols, cmask, s_hn, s_hd,
                                       s_hk, stride_w, stride_wk, W, False)
                h_dpre = silu_grad(h_dpre, h_pre)
            dw = state_grads(h_dpre, dw, h_r, h_rmask, taps, H0, WT, DHT, DH0, n, L, D, cols,
                             cmask, stride_w, stride_wk, s_hn, s_hd, s_hk, s_tn, s_td, s_tk,
                             W, HAS_DHT, RNE)
    tl.store(DWP + g * D * W + cols[None, :] * W + taps[:, None], dw,
             mask=(taps < W)[:, None] & cmask[None, :])
