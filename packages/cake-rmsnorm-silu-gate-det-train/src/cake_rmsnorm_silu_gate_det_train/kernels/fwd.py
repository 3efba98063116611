"""Forward: one program per tile of BLOCK_M whole rows; rstd saved per row and group.

A row of D elements is read as a ``[BLOCK_NG, BLOCK_G]`` tile: group ``g`` holds columns
``g * G ... g * G + G - 1`` (padding masked). With ``s = sigmoid(z)`` (fp32) and the gate
chosen by the constexpr ``ACTIVATION``: ``gate = silu(z) = z * s`` (``"silu"``) or
``gate = s`` (``"sigmoid"``):

    NORM_BEFORE_GATE:      u = x,        y = u * rstd * w * gate
    not NORM_BEFORE_GATE:  u = x * gate, y = u * rstd * w
    rstd = 1 / sqrt(sum_group(u * u) / G + eps)

``n_rows`` is not specialized on: a new token count does not compile a new kernel.
``OFF64``: 64-bit row offsets, needed where an offset of the launch reaches 2**31 elements.
"""

import triton
import triton.language as tl

from cake_rmsnorm_silu_gate_det_train.kernels.silu import sigmoid_and_complement


@triton.jit(do_not_specialize=["n_rows"])
def rmsnorm_silu_gate_fwd_kernel(
    X, Z, W, Y, RSTD,
    n_rows, group_size, n_groups, stride_x, stride_z, stride_y, eps,
    NORM_BEFORE_GATE: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_NG: tl.constexpr,
    BLOCK_G: tl.constexpr, OFF64: tl.constexpr,
):
    # The weight loaded before the rows, rsqrt, 32-bit offsets where they fit (faster); no
    # streaming cache hints, which cost time with outputs allocated per call (same bits;
    # measurements: docs/benchmarks/rmsnorm_silu_gate.md).
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    if OFF64:
        rows = rows.to(tl.int64)
    grp = tl.arange(0, BLOCK_NG)
    cin = tl.arange(0, BLOCK_G)
    rmask = rows < n_rows
    gmask = grp < n_groups
    cmask = cin < group_size
    wcols = grp[:, None] * group_size + cin[None, :]  # [BLOCK_NG, BLOCK_G] column index
    wmask = gmask[:, None] & cmask[None, :]
    mask = rmask[:, None, None] & wmask[None, :, :]
    w = tl.load(W + wcols, mask=wmask, other=0.0).to(tl.float32)
    x = tl.load(X + rows[:, None, None] * stride_x + wcols[None, :, :], mask=mask, other=0.0)
    z = tl.load(Z + rows[:, None, None] * stride_z + wcols[None, :, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    z = z.to(tl.float32)
    s, _ = sigmoid_and_complement(z)
    if ACTIVATION == "sigmoid":
        gate = s
    else:  # "silu"
        gate = z * s
    if NORM_BEFORE_GATE:
        u = x
    else:
        u = x * gate
    ms = tl.sum(u * u, axis=2) / group_size  # [BLOCK_M, BLOCK_NG]
    rstd = tl.math.rsqrt(ms + eps)
    y = u * rstd[:, :, None] * w[None, :, :]
    if NORM_BEFORE_GATE:
        y = y * gate
    tl.store(Y + rows[:, None, None] * stride_y + wcols[None, :, :], y.to(Y.dtype.element_ty),
             mask=mask)
    tl.store(RSTD + rows[:, None] * n_groups + grp[None, :], rstd,
             mask=rmask[:, None] & gmask[None, :])
