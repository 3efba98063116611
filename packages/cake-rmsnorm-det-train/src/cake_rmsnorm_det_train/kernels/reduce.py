"""dweight = sum of the P partial rows, in index order, in fp32.

Each program owns BLOCK_C columns and walks the partial rows in fixed steps of BLOCK_P
(a fixed in-tile tree inside a step, steps in increasing order). With an accumulator
(Megatron-style ``main_grad``), ACC += that sum, in the same fixed order.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_parts"])
def dweight_reduce_kernel(
    PART, DW, ACC, n_parts, n_cols,
    HAS_ACC: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n_cols
    s = tl.zeros([BLOCK_C], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        ps = (p0 + tl.arange(0, BLOCK_P)).to(tl.int64)
        m = (ps < n_parts)[:, None] & cmask[None, :]
        tile = tl.load(PART + ps[:, None] * n_cols + cols[None, :], mask=m, other=0.0)
        s += tl.sum(tile, axis=0)
    if HAS_ACC:
        a = tl.load(ACC + cols, mask=cmask, other=0.0)
        tl.store(ACC + cols, a + s, mask=cmask)
    else:
        tl.store(DW + cols, s.to(DW.dtype.element_ty), mask=cmask)
