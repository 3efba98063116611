"""Backward: dx, dz per row, and one fp32 partial dweight row per program (fixed order).

Program p of P handles row blocks p, p + P, p + 2P, ... in increasing order, accumulating
the dweight terms in fp32 registers, and writes its partial to ``DW_PART[p, :]`` (every
program writes its row, zeros when it owned no block). No atomics. Per row and group, with
``s = sigmoid(z)``, ``xhat = u * rstd`` and the gate chosen by the constexpr ``ACTIVATION``:
``"silu"``: ``gate = z * s``, ``dgate = d gate / dz = s * (1 + z * (1 - s))``;
``"sigmoid"``: ``gate = s``, ``dgate = s * (1 - s)``:

    NORM_BEFORE_GATE (u = x):        g = dy * gate * w,  dz = dy * xhat * w * dgate,
                                     dweight += dy * gate * xhat
    not NORM_BEFORE_GATE (u = x*gate): g = dy * w,       dweight += dy * xhat
    du = rstd * (g - xhat * mean_group(xhat * g))
    NORM_BEFORE_GATE: dx = du;  otherwise: dx = du * gate, dz = du * x * dgate
"""

import triton
import triton.language as tl

from cake_rmsnorm_silu_gate_det_train.kernels.silu import sigmoid_and_complement


@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_silu_gate_bwd_kernel(
    DY, X, Z, W, RSTD, DX, DZ, DW_PART,
    n_rows, n_cols, group_size, n_groups, n_programs,
    stride_dy, stride_x, stride_z, stride_dx, stride_dz,
    NORM_BEFORE_GATE: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_NG: tl.constexpr,
    BLOCK_G: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    grp = tl.arange(0, BLOCK_NG)
    cin = tl.arange(0, BLOCK_G)
    gmask = grp < n_groups
    cmask = cin < group_size
    wcols = grp[:, None] * group_size + cin[None, :]  # [BLOCK_NG, BLOCK_G]
    wmask = gmask[:, None] & cmask[None, :]
    w = tl.load(W + wcols, mask=wmask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_NG, BLOCK_G], dtype=tl.float32)
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    for blk in tl.range(pid, n_blocks, n_programs, num_stages=STAGES):
        rows = (blk * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        rmask = rows < n_rows
        mask = rmask[:, None, None] & wmask[None, :, :]
        r3 = rows[:, None, None]
        c3 = wcols[None, :, :]
        x = tl.load(X + r3 * stride_x + c3, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(Z + r3 * stride_z + c3, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r3 * stride_dy + c3, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows[:, None] * n_groups + grp[None, :],
                       mask=rmask[:, None] & gmask[None, :], other=0.0)[:, :, None]
        s, sc = sigmoid_and_complement(z)
        if ACTIVATION == "sigmoid":
            gate = s
            dgate = s * sc
        else:  # "silu"
            gate = z * s
            dgate = s * (1.0 + z * sc)
        if NORM_BEFORE_GATE:
            xhat = x * rstd
            dyg = dy * gate
            g = dyg * w[None, :, :]
            dz = dy * xhat * w[None, :, :] * dgate
            acc += dyg * xhat
        else:
            xhat = x * gate * rstd
            g = dy * w[None, :, :]
            acc += dy * xhat
        c = tl.sum(xhat * g, axis=2) / group_size
        du = (g - xhat * c[:, :, None]) * rstd
        if NORM_BEFORE_GATE:
            dx = du
        else:
            dx = du * gate
            dz = du * x * dgate
        tl.store(DX + r3 * stride_dx + c3, dx.to(DX.dtype.element_ty), mask=mask)
        tl.store(DZ + r3 * stride_dz + c3, dz.to(DZ.dtype.element_ty), mask=mask)
    dw = tl.sum(acc, axis=0)
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + wcols, dw, mask=wmask)
