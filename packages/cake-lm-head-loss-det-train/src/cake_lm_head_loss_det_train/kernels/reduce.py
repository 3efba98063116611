"""The loss: sum of the per-token losses in a fixed order (one program), / n_valid for mean.

Slot i of a BLOCK-wide fp32 register tile adds tokens i, i + BLOCK, i + 2 BLOCK, ... in
increasing order; the tile is then reduced by a fixed in-tile tree. No atomics.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n"])
def loss_sum_kernel(LOSS, NVALID, OUT, n, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for i0 in range(0, n, BLOCK):
        idx = (i0 + offs).to(tl.int64)
        acc += tl.load(LOSS + idx, mask=idx < n, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.maximum(tl.load(NVALID), 1).to(tl.float32)
    tl.store(OUT, total)
