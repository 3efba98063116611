"""nn.Module drop-ins."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from cake_rmsnorm_silu_gate_det_train.api import rmsnorm_silu_gate_det
from cake_rmsnorm_silu_gate_det_train.plan import check_group_size
from cake_rmsnorm_silu_gate_det_train.reference import check_activation


class _RMSNormGatedLayer(nn.Module):
    """The gated RMSNorm layer (FLA's / Mamba2's arguments, ``state_dict`` and
    ``forward(x, z)``) over the functional entry ``_entry`` of a subclass: this package's
    :class:`RMSNormGated` (``rmsnorm_silu_gate_det``) and cake-rmsnorm-silu-gate-nondet-train's
    ``RMSNormGatedNondet``; neither is an instance of the other."""

    _entry = None  # a subclass's functional entry, as a staticmethod

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, norm_before_gate: bool = True,
                 group_size: int | None = None, activation: str = "swish", device=None,
                 dtype=None):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) or \
                hidden_size < 1:
            raise ValueError(f"hidden_size: must be an int >= 1, got {hidden_size!r}")
        self.hidden_size = int(hidden_size)
        self.group_size = None if group_size is None else check_group_size(group_size,
                                                                            self.hidden_size)
        check_activation(activation)
        self.activation = activation
        self.eps = eps
        self.norm_before_gate = bool(norm_before_gate)
        self.weight = nn.Parameter(torch.empty(self.hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.hidden_size:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: last dim must be hidden_size={self.hidden_size}, got {got}")
        w = self.weight
        if w.dtype not in (torch.float32, x.dtype):
            w = w.to(x.dtype)
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            x = x.contiguous()
        if isinstance(z, torch.Tensor) and z.dim() > 0 and z.shape[-1] > 1 and z.stride(-1) != 1:
            z = z.contiguous()
        return self._entry(x, z, w, self.eps, norm_before_gate=self.norm_before_gate,
                           group_size=self.group_size, activation=self.activation)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, norm_before_gate={self.norm_before_gate}, "
                f"group_size={self.group_size}, activation={self.activation}")


class RMSNormGated(_RMSNormGatedLayer):
    """Gated RMSNorm (SiLU or sigmoid gate) on cake's deterministic kernels.

    Drop-in for FLA's ``FusedRMSNormGated`` (``norm_before_gate=True``, the default, with
    its ``activation`` argument: ``"swish"`` / ``"silu"`` for Qwen3-Next, ``"sigmoid"`` for
    Kimi Delta Attention) and Mamba2's ``RMSNormGated`` (``norm_before_gate=False``,
    ``group_size = D // ngroups``, SiLU): the same ``state_dict`` (``weight``
    ``[hidden_size]``, initialised to ones; ``bias`` is registered as ``None`` like theirs,
    so it is not in the state_dict). ``forward(x, z)`` computes
    :func:`cake_rmsnorm_silu_gate_det_train.rmsnorm_silu_gate_det` with this module's
    ``eps``, ``norm_before_gate``, ``group_size`` and ``activation``.

    Args:
        hidden_size: D.
        eps: > 0, added to the mean square (default 1e-6; FLA's module defaults to 1e-5,
            Mamba2 passes 1e-5: pass it explicitly to match a checkpoint's config).
        norm_before_gate: ``True``: ``rmsnorm(x) * weight * gate(z)``; ``False``:
            ``rmsnorm(x * gate(z)) * weight``.
        group_size: G dividing D, or ``None`` (the whole row).
        activation: the gate, as FLA's ``FusedRMSNormGated`` names it (same argument name
            and default): ``"swish"`` (default) or ``"silu"``, both
            ``gate(z) = z * sigmoid(z)``; ``"sigmoid"``: ``gate(z) = sigmoid(z)``. Kept as
            given in ``self.activation``.
        device, dtype: of the weight.

    ``x`` and ``z`` whose last dim is not contiguous are copied first. A weight whose
    dtype is neither fp32 nor x's is cast to x's dtype (differentiably). Not twice
    differentiable (double backward raises ``RuntimeError``).

    Raises:
        ValueError: bad constructor arguments (``activation`` included); in ``forward``,
            as the functional API, and if x's last dim is not ``hidden_size``.
    """

    _entry = staticmethod(rmsnorm_silu_gate_det)
