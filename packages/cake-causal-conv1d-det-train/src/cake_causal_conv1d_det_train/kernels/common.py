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
