"""Inputs of the cake-lm-head-loss-nondet-train tests (fresh random values, some labels
ignored)."""

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()


def make(shape, H, V, dtype=torch.float32, *, bias=False, ignore_every=4, seed=0):
    """hidden, weight, bias (or None), labels; every ``ignore_every``-th label is -100."""
    hidden = randn((*shape, H), dtype, DEV, seed=seed + 1).requires_grad_()
    weight = randn((V, H), dtype, DEV, seed=seed + 2, scale=H ** -0.5 * 2).requires_grad_()
    b = randn((V,), dtype, DEV, seed=seed + 3, scale=0.5).requires_grad_() if bias else None
    g = torch.Generator().manual_seed(seed + 4)
    labels = torch.randint(0, V, shape, generator=g)
    if ignore_every:
        labels.view(-1)[::ignore_every] = -100
    return hidden, weight, b, labels.to(DEV)
