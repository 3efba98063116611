"""Backward: dx per row, and one fp32 partial dweight row per program (fixed order).

Program p of P handles row blocks p, p + P, p + 2P, ... in increasing order, accumulating
dy * xhat in fp32 registers, and writes its partial to DW_PART[p, :]. No atomics.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_bwd_kernel(
    DY, DH, XH, W, RSTD, DX, DW_PART,
    n_rows, n_cols, n_programs, stride_dy, stride_dh, stride_x, stride_dx,
    HAS_DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
    W_OFFSET: tl.constexpr = 0.0,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < n_cols
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    if W_OFFSET != 0.0:  # the forward's scale offset + w; dweight is unchanged by it
        w = w + W_OFFSET
    acc = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    for blk in range(pid, n_blocks, n_programs):
        rows = (blk * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < n_rows
        mask = rmask[:, None] & cmask[None, :]
        x = tl.load(XH + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = x.to(tl.float32) * rstd[:, None]
        dy = dy.to(tl.float32)
        wdy = dy * w[None, :]
        c = tl.sum(xhat * wdy, axis=1) / n_cols
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH:
            dh = tl.load(DH + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0)
            dx += dh.to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)
        acc += dy * xhat
    dw = tl.sum(acc, axis=0)
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + cols, dw, mask=cmask)
