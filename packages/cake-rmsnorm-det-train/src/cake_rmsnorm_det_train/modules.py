"""nn.Module drop-ins."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from cake_rmsnorm_det_train.api import rmsnorm_det


class _RMSNormLayer(nn.Module):
    """``torch.nn.RMSNorm``'s arguments, ``state_dict`` and ``forward`` over the functional
    entry ``_entry`` of a subclass: this package's :class:`RMSNorm` (``rmsnorm_det``) and
    cake-rmsnorm-nondet-train's ``RMSNormNondet``; neither is an instance of the other."""

    _entry = None  # a subclass's functional entry, as a staticmethod

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        if not self.normalized_shape or any(s < 1 for s in self.normalized_shape):
            raise ValueError(f"normalized_shape: sizes must be >= 1, got {normalized_shape}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = len(self.normalized_shape)
        if not isinstance(x, torch.Tensor) or tuple(x.shape[x.dim() - k:]) != \
                self.normalized_shape or x.dim() < k:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: trailing dims must be {self.normalized_shape}, got {got}")
        eps = self.eps
        if eps is None:
            eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 1e-6
        w = self.weight
        if w is None:
            w = torch.ones(self.normalized_shape, dtype=x.dtype, device=x.device)
        elif w.dtype not in (torch.float32, x.dtype):
            w = w.to(x.dtype)
        if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
            x = x.contiguous()
        if k != 1:
            H = w.numel()
            y = self._entry(x.reshape(*x.shape[: x.dim() - k], H), w.reshape(H), eps)
            return y.reshape(x.shape)
        return self._entry(x, w, eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(_RMSNormLayer):
    """Drop-in for ``torch.nn.RMSNorm`` running cake's deterministic kernels.

    Same constructor arguments and ``state_dict`` keys (``weight``). Normalizes over the
    trailing ``normalized_shape`` dims (flattened to H; an input whose last dim is not
    contiguous is copied first, as torch would accept it). ``eps`` defaults, like torch's,
    to ``torch.finfo(x.dtype).eps``. Without ``elementwise_affine`` a ones vector of x's
    dtype stands in for the weight. A weight whose dtype is neither fp32 nor x's is cast
    to x's dtype (differentiably), so a bf16 module accepts fp32 inputs like torch's.
    Not twice differentiable (double backward raises ``RuntimeError``).

    Raises:
        ValueError: as :func:`cake_rmsnorm_det_train.rmsnorm_det`, and if x's trailing dims
            do not equal ``normalized_shape``.
    """

    _entry = staticmethod(rmsnorm_det)
