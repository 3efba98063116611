"""Shared pieces of the conv kernels: the input window, the pre-activation, bf16 rounding.

Positions are relative to the start of a sequence. The input at position p of sequence n is
x[p] for 0 <= p < L, the initial state's slot p + W - 1 for -(W - 1) <= p < 0 (when one is
given), and 0 otherwise (before the state, or past the end of the sequence).
"""

import triton
import triton.language as tl


@triton.jit
def x_window(X, H0, x_off, n, pos, L, cols, cmask, stride_xt, s_hn, s_hd, s_hk,
             W: tl.constexpr, BW: tl.constexpr, HAS_H0: tl.constexpr):
    """fp32 ``[R, BW, BLOCK_D]``: tap i of row r holds the input at position
    ``pos[r] - (W - 1) + i`` (taps i >= W are 0), the inputs weight[:, i] multiplies for
    the output at ``pos[r]``."""
    taps = tl.arange(0, BW)
    p = pos[:, None, None] + (taps - (W - 1))[None, :, None]
    tmask = (taps < W)[None, :, None] & cmask[None, None, :]
    in_seq = (p >= 0) & (p < L) & tmask
    v = tl.load(X + x_off + p * stride_xt + cols[None, None, :], mask=in_seq,
                other=0.0).to(tl.float32)
    if HAS_H0:
        in_h0 = (p < 0) & (p >= 1 - W) & tmask
        h = tl.load(H0 + n * s_hn + cols[None, None, :] * s_hd + (p + (W - 1)) * s_hk,
                    mask=in_h0, other=0.0).to(tl.float32)
        v += h
    return v


@triton.jit
def pre_activation(win, w2, b):
    """``b + sum_i w2[i] * win[:, i]``: ``[R, BLOCK_D]`` from a window and the taps
    ``w2`` ``[BW, BLOCK_D]`` (fp32, taps >= W zero) and the bias ``b`` ``[BLOCK_D]``."""
    return tl.sum(win * w2[None, :, :], axis=1) + b[None, :]


@triton.jit
def silu_grad(dy, pre):
    """d silu(pre) / d pre * dy, with silu(z) = z * sigmoid(z)."""
    s = tl.sigmoid(pre)
    return dy * (s * (1.0 + pre * (1.0 - s)))


@triton.jit
def round_bf16(v):
    """fp32 values rounded to the nearest bf16 (ties to even), still fp32. Used only under
    Triton's interpreter, whose fp32 -> bf16 cast truncates; compiled kernels cast with
    round-to-nearest-even themselves. NaNs pass through."""
    b = v.to(tl.uint32, bitcast=True)
    b = (b + (0x7FFF + ((b >> 16) & 1))) & 0xFFFF0000
    return tl.where(v != v, v, b.to(tl.float32, bitcast=True))
