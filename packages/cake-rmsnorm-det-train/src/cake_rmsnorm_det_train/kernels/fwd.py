"""Forward: y = h * rstd * w, h = x (+ residual), one tile of BLOCK_M whole rows/program.

``n_rows`` is not specialized on: a new batch size does not compile a new kernel.
``EVEN_H`` (H == BLOCK_H) drops the column mask and ``ONE_ROW`` (BLOCK_M == 1) makes the row
a scalar, so the common shapes load and store unmasked, fully vectorized rows; the
arithmetic, hence every bit of y, h and rstd, is the same on every path.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_fwd_kernel(
    X, R, W, Y, HOUT, RSTD,
    n_rows, n_cols, stride_x, stride_r, stride_y, stride_h, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
    EVEN_H: tl.constexpr = False, ONE_ROW: tl.constexpr = False,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    if ONE_ROW:
        row = pid.to(tl.int64)
        if EVEN_H:
            x = tl.load(X + row * stride_x + cols)
            w = tl.load(W + cols).to(tl.float32)
        else:
            cmask = cols < n_cols
            x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0)
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        x = x.to(tl.float32)
        if HAS_RESIDUAL:
            if EVEN_H:
                r = tl.load(R + row * stride_r + cols)
            else:
                r = tl.load(R + row * stride_r + cols, mask=cmask, other=0.0)
            h = (x + r.to(tl.float32)).to(HOUT.dtype.element_ty)
            if EVEN_H:
                tl.store(HOUT + row * stride_h + cols, h)
            else:
                tl.store(HOUT + row * stride_h + cols, h, mask=cmask)
            x = h.to(tl.float32)
        ms = tl.sum(x * x, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(ms + eps)
        y = (x * rstd * w).to(Y.dtype.element_ty)
        if EVEN_H:
            tl.store(Y + row * stride_y + cols, y)
        else:
            tl.store(Y + row * stride_y + cols, y, mask=cmask)
        tl.store(RSTD + row, rstd)
    else:
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < n_rows
        cmask = cols < n_cols
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
            h = (x + r.to(tl.float32)).to(HOUT.dtype.element_ty)
            tl.store(HOUT + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
            x = h.to(tl.float32)
        ms = tl.sum(x * x, axis=1) / n_cols
        rstd = 1.0 / tl.sqrt(ms + eps)
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=mask)
        tl.store(RSTD + rows, rstd, mask=rmask)
