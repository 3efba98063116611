"""The token <-> expert-row gathers of the MoE layer that sum: the combine (forward and
backward) and the permutation's backward, one launch each instead of k gathers and k
elementwise ops per call.

Every token's k slots are visited in slot order j = 0, 1, ..., k-1 and summed in fp32 in
that order; each output element is written by exactly one program (the combine backward
writes expert row ``SLOT[t·k + j]`` from token t's program: the slots are a permutation), so
no atomics and equal inputs give equal bits. Rows are addressed through int64 indices.
"""

from __future__ import annotations

from cake_core.triton_utils import select_backend, tl, triton

select_backend()


@triton.jit(do_not_specialize=["n_tok"])
def gather_sum_kernel(
    SRC, W, SLOT, Y, n_tok, n_col, stride_src, stride_y,
    K: tl.constexpr, HAS_W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``Y[t] = Σ_j W[t, j] · SRC[SLOT[t·K + j]]`` (``W`` read only with ``HAS_W``, else
    weight 1), j = 0..K-1 in order, fp32, stored in Y's dtype: each product rounded to fp32,
    then added (launched with ``enable_fp_fusion=False``, so no fused multiply-add; the
    bits of torch's ``acc + w * x``). Grid: (token blocks, column blocks)."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tm = t < n_tok
    m = tm[:, None] & (c < n_col)[None, :]
    for j in tl.static_range(K):
        s = tl.load(SLOT + t * K + j, mask=tm, other=0)
        x = tl.load(SRC + s[:, None] * stride_src + c[None, :], mask=m, other=0.0)
        x = x.to(tl.float32)
        if HAS_W:
            x = tl.load(W + t * K + j, mask=tm, other=0.0)[:, None] * x
        if j == 0:
            acc = x
        else:
            acc = acc + x
    tl.store(Y + t[:, None] * stride_y + c[None, :], acc.to(Y.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["n_tok"])
def combine_bwd_kernel(
    DY, OUT, W, SLOT, DOUT, DW, n_tok, n_col, stride_dy, stride_out, stride_dout,
    K: tl.constexpr, NEED_DOUT: tl.constexpr, NEED_DW: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """The combine's backward for a block of tokens: ``DOUT[SLOT[t·K + j]] = W[t, j] · DY[t]``
    (fp32 product, stored in DOUT's dtype) and ``DW[t·K + j] = <DY[t], OUT[SLOT[t·K + j]]>``
    (fp32, the columns in increasing blocks of ``BLOCK_D``). Grid: (token blocks,)."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    for j in tl.static_range(K):
        s = tl.load(SLOT + t * K + j, mask=tm, other=0)
        w = tl.load(W + t * K + j, mask=tm, other=0.0)
        dot = tl.zeros([BLOCK_T], dtype=tl.float32)
        for c0 in range(0, n_col, BLOCK_D):
            c = c0 + tl.arange(0, BLOCK_D)
            m = tm[:, None] & (c < n_col)[None, :]
            dy = tl.load(DY + t[:, None] * stride_dy + c[None, :], mask=m, other=0.0)
            dy = dy.to(tl.float32)
            if NEED_DOUT:
                tl.store(DOUT + s[:, None] * stride_dout + c[None, :],
                         (w[:, None] * dy).to(DOUT.dtype.element_ty), mask=m)
            if NEED_DW:
                o = tl.load(OUT + s[:, None] * stride_out + c[None, :], mask=m, other=0.0)
                dot += tl.sum(dy * o.to(tl.float32), axis=1)
        if NEED_DW:
            tl.store(DW + t * K + j, dot, mask=tm)
