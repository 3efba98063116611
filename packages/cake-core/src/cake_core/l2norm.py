"""Row-wise L2 norm (FLA's q/k ``use_qk_l2norm_in_kernel``), shared by the linear-attention
families (GDN, KDA).

Forward: ``y = x * rstd`` with ``rstd = 1 / sqrt(sum(x**2) + eps)`` over the last dim,
computed in fp32, ``y`` stored in x's dtype, ``rstd`` kept in fp32 for the backward.
Backward: ``dx = rstd * (dy - y * sum(dy * y))`` from the forward's stored ``y`` (so the
forward's input need not be kept) and rstd, in fp32, stored in the caller's dtype (FLA's
``l2norm_bwd``).

:func:`l2norm_fwd_kernel` and :func:`l2norm_bwd_kernel` run one program per ``BLOCK_R`` rows;
rows are independent and each row's sum is one in-register reduction, so equal inputs and
launch parameters give equal bits (no atomics). Importing this module imports Triton (after
:mod:`cake_core.triton_utils` picked the backend).
"""

from __future__ import annotations

import torch

from cake_core.linear_attention import L2NORM_EPS
from cake_core.triton_utils import cdiv, select_backend, tl, triton

select_backend()

__all__ = ["L2NORM_EPS", "l2norm_bwd", "l2norm_bwd_kernel", "l2norm_bwd_rows", "l2norm_fwd",
           "l2norm_fwd_kernel"]


@triton.jit
def l2norm_bwd_rows(dy, y, rstd):
    """The backward on whole rows held by the caller (fp32 ``[R, K]`` dy and the forward's
    output y, fp32 ``[R]`` rstd): ``dx = rstd * (dy - y * sum(dy * y))``, the row sum one
    in-register reduction. :func:`l2norm_bwd_kernel` and kernels that hold a whole row of
    the gradient (GDN's and KDA's local backwards) call it."""
    return rstd[:, None] * (dy - y * tl.sum(dy * y, axis=1)[:, None])


@triton.jit(do_not_specialize=["n_rows"])
def l2norm_fwd_kernel(
    X, Y, RSTD, n_rows, KD, eps,
    BLOCK_R: tl.constexpr, BK: tl.constexpr,
):
    """Rows ``[pid * BLOCK_R, (pid + 1) * BLOCK_R)`` of the contiguous ``[n_rows, KD]`` X:
    ``Y = X * RSTD``, ``RSTD = 1 / sqrt(sum(X**2) + eps)`` (fp32), ``BK >= KD``."""
    pid = tl.program_id(0)
    r = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ck = tl.arange(0, BK)
    rmask = r < n_rows
    mask = rmask[:, None] & (ck < KD)[None, :]
    x = tl.load(X + r[:, None] * KD + ck[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) + eps)
    tl.store(Y + r[:, None] * KD + ck[None, :], x * rstd[:, None], mask=mask)
    tl.store(RSTD + r, rstd, mask=rmask)


@triton.jit(do_not_specialize=["n_rows"])
def l2norm_bwd_kernel(
    Y, RSTD, DY, DX, n_rows, KD,
    BLOCK_R: tl.constexpr, BK: tl.constexpr,
):
    """Rows ``[pid * BLOCK_R, (pid + 1) * BLOCK_R)`` of the contiguous ``[n_rows, KD]`` Y, DY,
    DX: ``DX = RSTD * (DY - Y * sum(DY * Y))`` in fp32, stored in DX's dtype;
    ``BK >= KD``."""
    pid = tl.program_id(0)
    r = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ck = tl.arange(0, BK)
    rmask = r < n_rows
    mask = rmask[:, None] & (ck < KD)[None, :]
    offs = r[:, None] * KD + ck[None, :]
    rstd = tl.load(RSTD + r, mask=rmask, other=0.0)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    dx = l2norm_bwd_rows(dy, y, rstd)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


def l2norm_fwd(x: torch.Tensor, *, block_rows: int, block_k: int,
               num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x * rsqrt(sum(x**2) + L2NORM_EPS)`` over the last dim, and the per-row fp32 rstd.

    Args:
        x: contiguous ``[..., K]`` tensor (fp32/bf16/fp16) on the backend's device.
        block_rows: rows per program (a power of two); block_k: a power of two ``>= K``;
            num_warps: warps per program. Launch parameters (a family's plan fields): equal
            parameters give equal bits.

    Returns:
        ``(y, rstd)``: ``y`` like x (computed in fp32, stored in x's dtype, as FLA), ``rstd``
        fp32 ``x.shape[:-1]``. With no rows nothing is launched.

    Raises:
        ValueError: ``x`` not contiguous, or ``block_k < K``. The caller checks dtypes and
            devices; this helper allocates the outputs and launches.
    """
    K = x.shape[-1]
    if not x.is_contiguous():
        raise ValueError(f"x: must be contiguous, got strides {x.stride()}")
    if block_k < K:
        raise ValueError(f"block_k: must be >= K = {K}, got {block_k}")
    rows = x.numel() // K if K else 0
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if rows:
        l2norm_fwd_kernel[(cdiv(rows, block_rows),)](
            x, y, rstd, rows, K, L2NORM_EPS,
            BLOCK_R=block_rows, BK=block_k, num_warps=num_warps)
    return y, rstd


def l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor, *, block_rows: int,
               block_k: int, num_warps: int, out_dtype: torch.dtype | None = None
               ) -> torch.Tensor:
    """Gradient through ``y = x * rstd``, ``rstd = rsqrt(sum(x**2) + eps)``, from the
    forward's outputs: ``dx = rstd * (dy - y * sum(dy * y))`` in fp32 (y as
    :func:`l2norm_fwd` stored it, as FLA's ``l2norm_bwd``); one launch.

    Args:
        y, rstd: :func:`l2norm_fwd`'s outputs (``[..., K]`` and fp32 ``[...]``); dy: the
            gradient of y, ``[..., K]`` (any float dtype; contiguous copies are made of
            non-contiguous y / dy).
        block_rows, block_k, num_warps: launch parameters as :func:`l2norm_fwd`'s.
        out_dtype: dx's dtype (default y's).

    Returns:
        dx ``[..., K]`` in ``out_dtype``. With no rows nothing is launched.
    """
    K = y.shape[-1]
    if block_k < K:
        raise ValueError(f"block_k: must be >= K = {K}, got {block_k}")
    y, dy, rstd = y.contiguous(), dy.contiguous(), rstd.contiguous()
    dx = torch.empty(y.shape, dtype=out_dtype or y.dtype, device=y.device)
    rows = y.numel() // K if K else 0
    if rows:
        l2norm_bwd_kernel[(cdiv(rows, block_rows),)](
            y, rstd, dy, dx, rows, K, BLOCK_R=block_rows, BK=block_k, num_warps=num_warps)
    return dx
