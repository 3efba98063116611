"""mHC in plain torch: the spec the kernels meet (float64-capable, differentiable).

Used by the benchmark as the "torch eager" and "torch.compile" anchors. Sinkhorn here runs
in the plain domain, as the paper writes it: M = exp(h_res - rowmax(h_res)) (a per-row
factor, which the first row normalization cancels exactly), then ``sinkhorn_iters`` times
rows / row sums, columns / column sums.
"""

from __future__ import annotations

import torch


def mhc_coefficients_reference(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                               bias: torch.Tensor, *, eps: float = 1e-6,
                               sinkhorn_iters: int = 20, dtype: torch.dtype | None = None):
    """(H_pre ``[..., n]``, H_post ``[..., n]``, H_res ``[..., n, n]``) for X ``[..., n, C]``,
    computed in ``dtype`` (default fp32; pass ``torch.float64`` for the reference)."""
    dtype = dtype or torch.float32
    n, C = X.shape[-2], X.shape[-1]
    x = X.to(dtype).reshape(*X.shape[:-2], n * C)
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    mix = (x @ phi.to(dtype)) * rstd
    a, b = alpha.to(dtype), bias.to(dtype)
    h_pre = a[0] * mix[..., :n] + b[:n]
    h_post = a[1] * mix[..., n:2 * n] + b[n:2 * n]
    h_res = (a[2] * mix[..., 2 * n:] + b[2 * n:]).reshape(*X.shape[:-2], n, n)
    m = torch.exp(h_res - h_res.amax(-1, keepdim=True))
    for _ in range(sinkhorn_iters):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return torch.sigmoid(h_pre), 2 * torch.sigmoid(h_post), m


def mhc_reference(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor,
                  branch, *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """Y of one mHC layer around ``branch`` (a callable ``[..., C] -> [..., C]``), computed
    in ``dtype`` (default fp32); U is cast to X's dtype before the branch and Y returned in
    X's dtype, as the kernels do."""
    dtype = dtype or torch.float32
    H_pre, H_post, H_res = mhc_coefficients_reference(X, phi, alpha, bias, eps=eps,
                                                      sinkhorn_iters=sinkhorn_iters,
                                                      dtype=dtype)
    Xd = X.to(dtype)
    U = (H_pre.unsqueeze(-1) * Xd).sum(-2)
    B = branch(U.to(X.dtype)).to(dtype)
    Y = H_post.unsqueeze(-1) * B.unsqueeze(-2) + H_res @ Xd
    return Y.to(X.dtype)
