"""Shared inputs, runs and the float64 reference of the cake-mhc-nondet-train tests."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_mhc_det_train import mhc_reference

DEV = default_device()
NAMES = ("Y", "dX", "dphi", "dalpha", "dbias", "dW")


def make(T, n, C, dtype=torch.float32, seed=0):
    """X ``[T, n, C]``, phi, alpha, bias, the branch weight W ``[C, C]`` and dY."""
    M = 2 * n + n * n
    return {"X": randn((T, n, C), dtype, DEV, seed=seed),
            "phi": randn((n * C, M), torch.float32, DEV, seed=seed + 1,
                         scale=(n * C) ** -0.5 * 2),
            "alpha": torch.tensor([0.8, 1.1, 1.3], device=DEV),
            "bias": randn((M,), torch.float32, DEV, seed=seed + 2, scale=0.5),
            "W": randn((C, C), torch.float32, DEV, seed=seed + 3, scale=C ** -0.5),
            "dY": randn((T, n, C), dtype, DEV, seed=seed + 4)}


def run(prepare, finish, case, **kw):
    """Y and the gradients of sum(Y * dY) by ``prepare`` / ``finish`` (a cake pair), the
    branch ``tanh(U @ W)`` between."""
    X, phi, alpha, bias, W = (case[k].detach().clone().requires_grad_()
                              for k in ("X", "phi", "alpha", "bias", "W"))
    U, handle = prepare(X, phi, alpha, bias, **kw)
    Y = finish(X, torch.tanh(U.float() @ W).to(U.dtype), handle)
    (Y.float() * case["dY"].float()).sum().backward()
    return dict(zip(NAMES, (Y.detach(), X.grad, phi.grad, alpha.grad, bias.grad, W.grad),
                    strict=True))


def reference(case):
    """The same in float64 through cake-mhc-det-train's reference."""
    X, phi, alpha, bias, W = (case[k].detach().double().requires_grad_()
                              for k in ("X", "phi", "alpha", "bias", "W"))
    Y = mhc_reference(X, phi, alpha, bias, lambda U: torch.tanh(U @ W), dtype=torch.float64)
    (Y * case["dY"].double()).sum().backward()
    return dict(zip(NAMES, (Y.detach(), X.grad, phi.grad, alpha.grad, bias.grad, W.grad),
                    strict=True))
