"""Overflow-free sigmoid for both gates (``silu(z) = z * sigmoid(z)`` and ``sigmoid(z)``),
shared by the forward and backward kernels.

``sigmoid(z)`` and ``1 - sigmoid(z)`` from ``e = exp(-|z|)`` (never above 1, so never inf):
for z >= 0, ``s = 1 / (1 + e)`` and ``1 - s = e / (1 + e)``; for z < 0 the two swap. The
complement is computed directly, not as ``1 - s``, so it keeps its relative precision
where s rounds to 1 (z of +30 and more): the derivatives ``s * (1 + z * (1 - s))`` (SiLU)
and ``s * (1 - s)`` (sigmoid) stay accurate in both tails.
"""

import triton
import triton.language as tl


@triton.jit
def sigmoid_and_complement(z):
    """``(sigmoid(z), 1 - sigmoid(z))`` in fp32, finite for every finite z."""
    e = tl.exp(-tl.abs(z))
    r = 1.0 / (1.0 + e)
    pos = z >= 0.0
    s = tl.where(pos, r, e * r)
    c = tl.where(pos, e * r, r)
    return s, c
