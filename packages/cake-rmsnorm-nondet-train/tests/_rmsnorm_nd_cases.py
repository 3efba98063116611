"""Inputs and the float64 reference of the cake-rmsnorm-nondet-train tests (the reference
is cake-rmsnorm-det-train's: this package ships none)."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import rmsnorm_reference

DEV = default_device()


def make(shape, dtype=torch.float32, *, seed=0, w_dtype=None):
    """x, weight (around 1), dy."""
    H = shape[-1]
    x = randn(shape, dtype, DEV, seed=seed)
    w = randn((H,), w_dtype or dtype, DEV, seed=seed + 1, scale=0.5).add_(1)
    dy = randn(shape, dtype, DEV, seed=seed + 2)
    return x, w, dy


def reference(x, w, dy, eps, residual=None, dh=None):
    """float64 (y, dx, dweight, dresidual, h) by autograd through the reference."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    r64 = residual.detach().double().requires_grad_() if residual is not None else None
    out = rmsnorm_reference(x64, w64, eps, r64, dtype=torch.float64)
    if residual is None:
        out.backward(dy.double())
        return out.detach(), x64.grad, w64.grad, None, None
    y, h = out
    torch.autograd.backward([y, h], [dy.double(), dh.double()])
    return y.detach(), x64.grad, w64.grad, r64.grad, h.detach()
