"""RMSNorm in plain torch: the spec the kernels meet (float64-capable)."""

from __future__ import annotations

import torch


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      residual: torch.Tensor | None = None, *, dtype: torch.dtype | None = None,
                      offset: float = 0.0):
    """y = h * rsqrt(mean(h**2, -1) + eps) * (offset + weight), with h = x (+ residual).

    Computes in ``dtype`` (default: x's dtype; pass ``torch.float64`` for the reference).
    Returns ``y``, or ``(y, h)`` when ``residual`` is given. Differentiable by autograd.
    """
    dtype = dtype or x.dtype
    h = x.to(dtype) if residual is None else x.to(dtype) + residual.to(dtype)
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    y = h * rstd * (offset + weight.to(dtype))
    return y if residual is None else (y, h)
