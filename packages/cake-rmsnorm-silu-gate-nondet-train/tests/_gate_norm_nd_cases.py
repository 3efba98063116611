"""Inputs and the float64 reference of the cake-rmsnorm-silu-gate-nondet-train tests (the
reference is cake-rmsnorm-silu-gate-det-train's: this package ships none)."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_reference

DEV = default_device()


def make(shape, dtype=torch.float32, *, seed=0, w_dtype=None):
    """x, z, weight (around 1), dy."""
    D = shape[-1]
    x = randn(shape, dtype, DEV, seed=seed)
    z = randn(shape, dtype, DEV, seed=seed + 1, scale=2.0)
    w = (randn((D,), torch.float64, "cpu", seed=seed + 2, scale=0.3) + 1).to(DEV, w_dtype or dtype)
    dy = randn(shape, dtype, DEV, seed=seed + 3)
    return x, z, w, dy


def reference(x, z, w, dy, eps=1e-6, **kw):
    """float64 y, dx, dz, dweight by autograd through the reference."""
    x64, z64, w64 = (t.detach().double().requires_grad_() for t in (x, z, w))
    y = rmsnorm_silu_gate_reference(x64, z64, w64, eps, dtype=torch.float64, **kw)
    y.backward(dy.double())
    return y.detach(), x64.grad, z64.grad, w64.grad


def run(fn, x, z, w, dy, eps=1e-6, **kw):
    """y, dx, dz, dweight of ``fn`` by autograd."""
    x, z, w = (t.detach().clone().requires_grad_() for t in (x, z, w))
    y = fn(x, z, w, eps, **kw)
    y.backward(dy)
    return y.detach(), x.grad, z.grad, w.grad
