"""Shared inputs of the cake-moe-grouped-nondet-gemm tests (small: the interpreter runs
every program)."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()
DTYPE = torch.float32 if DEV.type == "cpu" else torch.bfloat16


def offs_of(sizes) -> torch.Tensor:
    """int32 cumulative ends of per-expert row counts."""
    return torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32).to(DEV)


def make(sizes, N=20, K=24, dtype=DTYPE, tail=0, seed=0):
    """x ``[sum(sizes) + tail, K]``, weight ``[E, N, K]``, offs, dy ``[M, N]``."""
    M = sum(sizes) + tail
    x = randn((M, K), dtype, DEV, seed=seed + 1)
    w = randn((len(sizes), N, K), dtype, DEV, seed=seed + 2, scale=K ** -0.5)
    dy = randn((M, N), dtype, DEV, seed=seed + 3)
    return x, w, offs_of(sizes), dy
