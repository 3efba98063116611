"""Gated RMSNorm in plain torch: the spec the kernels meet (float64-capable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm_silu_gate_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                                eps: float = 1e-6, *, norm_before_gate: bool = True,
                                group_size: int | None = None,
                                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gated RMSNorm over the last dim D, or over contiguous groups of ``group_size``.

    ``norm_before_gate=True`` (FLA ``rms_norm_gated`` with ``activation="swish"``, no bias;
    Qwen3-Next): ``y = u * rstd * weight * silu(z)`` with ``u = x``.
    ``norm_before_gate=False`` (Mamba2 ``RMSNormGated``): ``y = u * rstd * weight`` with
    ``u = x * silu(z)``.
    ``rstd = 1 / sqrt(mean(u**2) + eps)`` per row (per group with ``group_size``).

    Computes in ``dtype`` (default: x's dtype; pass ``torch.float64`` for the reference) and
    returns that dtype, no rounding in between. Differentiable by autograd.
    """
    dtype = dtype or x.dtype
    x, z, w = x.to(dtype), z.to(dtype), weight.to(dtype)
    D = x.shape[-1]
    G = D if group_size is None else group_size
    gate = F.silu(z)
    u = x if norm_before_gate else x * gate
    ug = u.reshape(*u.shape[:-1], D // G, G)
    rstd = torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + eps)
    y = (ug * rstd).reshape(u.shape) * w
    return y * gate if norm_before_gate else y
