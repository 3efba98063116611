"""The dense projection in plain torch: the spec the kernels meet (float64-capable)."""

from __future__ import annotations

import torch


def dense_projection_reference(x: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None = None, *,
                               dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x · weightᵀ + bias`` (``torch.nn.functional.linear``), x ``[..., K]``,
    weight ``[N, K]``, bias ``[N]``.

    Computes in ``dtype`` (default: x's dtype; pass ``torch.float64`` for the reference).
    Differentiable by autograd: dx = dy · W, dW = dyᵀ · x, dbias = Σ_tokens dy.
    """
    dtype = dtype or x.dtype
    return torch.nn.functional.linear(x.to(dtype), weight.to(dtype),
                                      None if bias is None else bias.to(dtype))
