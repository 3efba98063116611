"""Shared inputs of the MoE grouped GEMM tests (small: the interpreter runs every program)."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()


def offs_of(sizes) -> torch.Tensor:
    """int32 cumulative ends of per-expert row counts."""
    return torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32).to(DEV)


def make(sizes, N=20, K=24, dtype=torch.float32, tail=0, seed=0):
    """x ``[sum(sizes) + tail, K]``, weight ``[E, N, K]``, offs, dy ``[M, N]``."""
    M = sum(sizes) + tail
    E = len(sizes)
    x = randn((M, K), dtype, DEV, seed=seed + 1)
    w = randn((E, N, K), dtype, DEV, seed=seed + 2, scale=K ** -0.5)
    dy = randn((M, N), dtype, DEV, seed=seed + 3)
    return x, w, offs_of(sizes), dy


def grouped_mm_route_missing() -> str | None:
    """Why a forced plan ``grouped_mm_fwd_dgrad = 1`` cannot run here (None when it can):
    torch without ``_grouped_mm``, or a GPU other than compute capability 9.x / 10.x."""
    if getattr(torch, "_grouped_mm", None) is None:
        return "torch._grouped_mm is not in this torch"
    if DEV.type == "cuda" and torch.cuda.get_device_capability(DEV)[0] not in (9, 10):
        return "torch._grouped_mm's fast path needs compute capability 9.x or 10.x"
    return None
