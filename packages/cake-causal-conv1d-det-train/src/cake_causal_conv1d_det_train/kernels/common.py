"""Shared pieces of the conv kernels (bf16 rounding under the interpreter), and the
conventions every kernel follows.

Positions are relative to the start of a sequence. The input at position p of sequence n is
x[p] for 0 <= p < L, the initial state's slot p + W - 1 for -(W - 1) <= p < 0 (when one is
given), and 0 otherwise (before the state, or past the end of the sequence).

The pre-activation is accumulated tap by tap on 2-D [tokens, channels] tiles, in one fixed
order, in the forward and in the backward's recomputation alike::

    pre = b;  pre += w[i] * x[t - W + 1 + i]  for i = 0..W-1  (0 where outside x)
    then, only in a sequence's first block(s):  pre += w[i] * state[...]  for i = 0..W-1
          (0 where the position is not in the state)

so the backward recomputes the forward's pre-activation in the same order (the same bits
under the interpreter; compiled, if both kernels fuse the multiply-adds alike; determinism
does not rely on it). The x taps use one base
pointer tile plus a scalar row offset per tap; the state's loads only run in the programs
whose rows can reach it (runtime branch): this keeps the kernels free of register spills
(checked with ptxas for sm_90). SiLU ``z * sigmoid(z)`` and its derivative
``sigmoid(z) * (1 + z * (1 - sigmoid(z)))`` are written out, with
sigmoid(z) = 1 / (1 + exp(-z)) (what tl.sigmoid computes). Names assigned inside a runtime
branch are the branch's own (a name shared with the code around it must keep its type
across the branch when compiled).
"""

import triton
import triton.language as tl


@triton.jit
def round_bf16(v):
    """fp32 values rounded to the nearest bf16 (ties to even), still fp32. Used only under
    Triton's interpreter, whose fp32 -> bf16 cast truncates; compiled kernels cast with
    round-to-nearest-even themselves. NaNs pass through."""
    b = v.to(tl.uint32, bitcast=True)
    b = (b + (0x7FFF + ((b >> 16) & 1))) & 0xFFFF0000
    return tl.where(v != v, v, b.to(tl.float32, bitcast=True))


@triton.jit
def block_origin(g, TABLE, CU, T, D, n_blk_seq, stride_xb, stride_xt, stride_yb, stride_yt,
                 VARLEN: tl.constexpr, BLOCK_T: tl.constexpr):
    """Where token block ``g`` lies: ``(n, start, L, x_off, y_off, out_off)``: its sequence
    n, its first position in it, the sequence's length, and the element offsets of the
    sequence's first token in x, in a second strided input y (dy; the forward passes x's
    strides again and ignores it) and in a contiguous ``[.., D]`` output. Packed: row g of
    the (sequence, start) table and ``cu_seqlens``; fixed length: ``n_blk_seq`` blocks per
    sequence."""
    if VARLEN:
        n = tl.load(TABLE + 2 * g).to(tl.int64)
        start = tl.load(TABLE + 2 * g + 1).to(tl.int64)
        bos = tl.load(CU + n).to(tl.int64)
        L = tl.load(CU + n + 1).to(tl.int64) - bos
        x_off = bos * stride_xt
        y_off = bos * stride_yt
        out_off = bos * D
    else:
        n = g // n_blk_seq
        start = (g - n * n_blk_seq) * BLOCK_T
        L = T
        x_off = n * stride_xb
        y_off = n * stride_yb
        out_off = n * T * D
    return n, start, L, x_off, y_off, out_off


@triton.jit
def add_x_taps(pre, xp, shift, u, L, WT, cols, cmask, stride_xt, stride_w, stride_wk,
               W: tl.constexpr):
    """``pre += w[i] * x[u - W + 1 + i]`` for i = 0..W-1 in that order (0 outside the
    sequence), the x tile of tap i read at ``xp + (shift + i - (W - 1))`` rows (``xp``: the
    pointer tile of the rows ``u - shift``): one base pointer tile and a scalar row offset
    per tap, the form that keeps the kernels free of spills."""
    for i in tl.static_range(W):
        p = u + (i - (W - 1))
        xi = tl.load(xp + (shift + i - (W - 1)) * stride_xt,
                     mask=((p >= 0) & (p < L))[:, None] & cmask[None, :], other=0.0)
        wi = tl.load(WT + cols * stride_w + i * stride_wk, mask=cmask, other=0.0).to(tl.float32)
        pre += wi[None, :] * xi.to(tl.float32)
    return pre


@triton.jit
def add_state_taps(pre, H0, WT, n, u, rmask, cols, cmask, s_hn, s_hd, s_hk, stride_w,
                   stride_wk, W: tl.constexpr, MASK_ROWS: tl.constexpr):
    """``pre += w[i] * state[n, :, u - W + 1 + i + W - 1]`` for i = 0..W-1 in that order,
    where that position is before the sequence start (0 elsewhere); with ``MASK_ROWS`` only
    on the rows ``rmask``. Callers run it only in blocks whose rows can reach the state."""
    for h_i in tl.static_range(W):
        h_p = u + (h_i - (W - 1))
        if MASK_ROWS:
            h_m = (rmask & (h_p < 0))[:, None] & cmask[None, :]
        else:
            h_m = (h_p < 0)[:, None] & cmask[None, :]
        h_v = tl.load(H0 + n * s_hn + cols[None, :] * s_hd + (h_p + (W - 1))[:, None] * s_hk,
                      mask=h_m, other=0.0)
        h_w = tl.load(WT + cols * stride_w + h_i * stride_wk, mask=cmask,
                      other=0.0).to(tl.float32)
        pre += h_w[None, :] * h_v.to(tl.float32)
    return pre


@triton.jit
def silu_grad(dy, pre):
    """``dy * silu'(pre)`` = ``dy * sigmoid(pre) * (1 + pre * (1 - sigmoid(pre)))``."""
    sig = 1.0 / (1.0 + tl.exp(-pre))
    return dy * (sig * (1.0 + pre * (1.0 - sig)))


@triton.jit
def state_grads(h_d, dw, h_r, h_rmask, taps, H0, WT, DHT, DH0, n, L, D, cols, cmask,
                stride_w, stride_wk, s_hn, s_hd, s_hk, s_tn, s_td, s_tk,
                W: tl.constexpr, HAS_DHT: tl.constexpr, RNE: tl.constexpr):
    """The state's gradients in a sequence's first block, from ``h_d`` ``[BW, BLOCK_D]``,
    dpre at the outputs u = 0 .. W - 2 (``h_r``: 0 .. BW - 1, ``h_rmask``: h_r < W - 1):
    stores DH0[n, c, k] = sum_u weight[c, k - u] * h_d[u] (0 <= k - u < W) plus DHT[n, c,
    k - L] where the slot is still inside the final state (k >= L), and returns ``dw`` plus
    the dweight pairs whose input is in the state (output u reads slot u + i at tap i)."""
    # band[k, u, c] = weight[c, k - u], the tap output u applies to slot k
    h_j = h_r[:, None] - h_r[None, :]
    h_bm = ((h_j >= 0) & (h_j < W))[:, :, None] & cmask[None, None, :]
    h_band = tl.load(WT + cols[None, None, :] * stride_w + h_j[:, :, None] * stride_wk,
                     mask=h_bm, other=0.0).to(tl.float32)
    h_dh = tl.sum(h_band * h_d[None, :, :], axis=1)
    if HAS_DHT:
        h_m = (h_rmask & (h_r >= L))[:, None] & cmask[None, :]
        h_dh += tl.load(DHT + n * s_tn + cols[None, :] * s_td + (h_r - L)[:, None] * s_tk,
                        mask=h_m, other=0.0).to(tl.float32)
    if RNE:
        h_dh = round_bf16(h_dh)
    tl.store(DH0 + n * D * (W - 1) + cols[None, :] * (W - 1) + h_r[:, None],
             h_dh.to(DH0.dtype.element_ty), mask=h_rmask[:, None] & cmask[None, :])
    h_slot = h_r[:, None] + taps[None, :]
    h_sm = (h_rmask[:, None] & (h_slot < W - 1))[:, :, None] & cmask[None, None, :]
    h_s = tl.load(H0 + n * s_hn + cols[None, None, :] * s_hd + h_slot[:, :, None] * s_hk,
                  mask=h_sm, other=0.0).to(tl.float32)
    dw += tl.sum(h_d[:, None, :] * h_s, axis=0)
    return dw
