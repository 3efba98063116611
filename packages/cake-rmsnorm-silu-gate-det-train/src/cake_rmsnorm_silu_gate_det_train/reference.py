"""Gated RMSNorm in plain torch: the spec the kernels meet (float64-capable).

Also the one place that names the gates (:data:`ACTIVATIONS`, :func:`check_activation`),
so the entry points, the module and this reference accept the same spellings. Imports no
Triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Accepted ``activation`` spellings -> the gate the kernels compute (FLA's names:
#: ``"swish"`` is ``"silu"``).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "sigmoid": "sigmoid"}


def check_activation(activation, name: str = "activation") -> str:
    """The canonical gate (``"silu"`` or ``"sigmoid"``) for ``activation``.

    Raises:
        ValueError: ``activation`` is not one of ``"silu"``, ``"swish"``, ``"sigmoid"``
            (exact, lower-case strings, as FLA's ``FusedRMSNormGated`` accepts).
    """
    act = ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if act is None:
        raise ValueError(f"{name}: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return act


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    """``sigmoid(z)`` from ``e = exp(-|z|)``, whose autograd derivative ``e / (1 + e)**2``
    keeps its relative precision in both tails. ``torch.sigmoid``'s backward forms
    ``s * (1 - s)``, and ``1 - s`` cancels for large positive z even in float64 (about
    1e-3 relative error at z = 30), which would make a poor spec for the sigmoid gate's
    dz. The SiLU gate's derivative is about 1 there, so ``F.silu`` needs no such care."""
    pos = z >= 0
    e = torch.exp(torch.where(pos, -z, z))
    return torch.where(pos, 1 / (1 + e), e / (1 + e))


def rmsnorm_silu_gate_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                                eps: float = 1e-6, *, norm_before_gate: bool = True,
                                group_size: int | None = None, activation: str = "silu",
                                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gated RMSNorm over the last dim D, or over contiguous groups of ``group_size``.

    The gate is ``gate = silu(z) = z * sigmoid(z)`` (``activation="silu"`` or ``"swish"``,
    the default) or ``gate = sigmoid(z)`` (``activation="sigmoid"``, Kimi Delta
    Attention's output norm), as FLA's ``rms_norm_gated``.

    ``norm_before_gate=True`` (FLA ``rms_norm_gated`` / ``FusedRMSNormGated``, no bias;
    Qwen3-Next, KDA): ``y = u * rstd * weight * gate`` with ``u = x``.
    ``norm_before_gate=False`` (Mamba2 ``RMSNormGated``): ``y = u * rstd * weight`` with
    ``u = x * gate``.
    ``rstd = 1 / sqrt(mean(u**2) + eps)`` per row (per group with ``group_size``).

    Computes in ``dtype`` (default: x's dtype; pass ``torch.float64`` for the reference) and
    returns that dtype, no rounding in between. Differentiable by autograd. Checks only
    ``activation`` (ValueError, as :func:`check_activation`).
    """
    act = check_activation(activation)
    dtype = dtype or x.dtype
    x, z, w = x.to(dtype), z.to(dtype), weight.to(dtype)
    D = x.shape[-1]
    G = D if group_size is None else group_size
    gate = F.silu(z) if act == "silu" else _sigmoid(z)
    u = x if norm_before_gate else x * gate
    ug = u.reshape(*u.shape[:-1], D // G, G)
    rstd = torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + eps)
    y = (ug * rstd).reshape(u.shape) * w
    return y * gate if norm_before_gate else y
