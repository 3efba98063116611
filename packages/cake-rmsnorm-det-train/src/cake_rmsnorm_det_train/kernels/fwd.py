"""Forward: y = h * rstd * (W_OFFSET + w), h = x (+ residual), one tile of BLOCK_M whole
rows per program.

``n_rows`` is not specialized on: a new batch size does not compile a new kernel. ``OFF64``:
64-bit row offsets, needed where a row offset of the launch reaches 2**31 elements.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_fwd_kernel(
    X, R, W, Y, HOUT, RSTD,
    n_rows, n_cols, stride_x, stride_r, stride_y, stride_h, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
    OFF64: tl.constexpr, W_OFFSET: tl.constexpr = 0.0,
):
    # the weight loaded before the rows (faster); no streaming cache hints, which cost time
    # with outputs allocated per call as in training (measurements: docs/benchmarks/rmsnorm.md)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    if OFF64:
        rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    if W_OFFSET != 0.0:  # zero-centred weights (Gemma, Qwen3-Next): scale by offset + w
        w = w + W_OFFSET
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        h = (x + r.to(tl.float32)).to(HOUT.dtype.element_ty)
        tl.store(HOUT + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    ms = tl.sum(x * x, axis=1) / n_cols
    rstd = tl.math.rsqrt(ms + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty),
             mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)
