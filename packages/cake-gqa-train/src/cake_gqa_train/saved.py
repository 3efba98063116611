"""GQASavedSet and GQAWorkspace (mode ``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace, check_int
from cake_core.checks import check_alloc_device

from cake_gqa_train.plan import GQAPlan


class GQASavedSet(SavedSet):
    """What :func:`~cake_gqa_train.gqa_fwd` returns for :func:`~cake_gqa_train.gqa_bwd`
    (mode ``nondet``): the same tensors and meta as cake-gqa-det-train's
    ``GQADetSavedSet``; a det backward refuses it and this package refuses the det one."""

    tensor_names = ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
    format_version = 1


class GQAWorkspace(Workspace):
    """The backward's fp32 scratch for one plan (mode ``nondet``): ``delta`` (rowsum(dO *
    O), ``num_heads * max_tokens`` values) and ``dkv_accum`` (dK and dV's atomic sums,
    ``2 * max_kv_tokens * num_kv_heads * head_dim`` values). Build with :meth:`for_plan`; every
    backward overwrites what it uses; one workspace serves one backward at a time."""

    @classmethod
    def for_plan(cls, plan: GQAPlan, device: torch.device | str, num_heads: int,
                 max_tokens: int, num_kv_heads: int, max_kv_tokens: int) -> GQAWorkspace:
        """Allocate room for ``num_heads`` query heads of ``max_tokens`` query tokens and
        ``num_kv_heads`` KV heads of ``max_kv_tokens`` key tokens
        (:func:`~cake_gqa_train.workspace_bytes` gives its bytes without allocating)."""
        device = check_alloc_device(device)
        shapes = workspace_shapes(plan, num_heads, max_tokens, num_kv_heads, max_kv_tokens)
        return cls(plan, device, {n: torch.empty(shape, dtype=dtype, device=device)
                                  for n, (shape, dtype) in shapes.items()})


def workspace_shapes(plan: GQAPlan, num_heads: int, max_tokens: int, num_kv_heads: int,
                     max_kv_tokens: int) -> dict:
    """``{name: (shape, dtype)}`` of :meth:`GQAWorkspace.for_plan`'s buffers, after its
    argument checks (``ValueError``); what it allocates and ``workspace_bytes`` counts."""
    if not isinstance(plan, GQAPlan):
        raise ValueError(f"plan: expected GQAPlan, got {type(plan).__name__}")
    num_heads = check_int(num_heads, "num_heads", 1)
    max_tokens = check_int(max_tokens, "max_tokens", 0)
    num_kv_heads = check_int(num_kv_heads, "num_kv_heads", 1)
    max_kv_tokens = check_int(max_kv_tokens, "max_kv_tokens", 0)
    return {"delta": ((num_heads * max_tokens,), torch.float32),
            "dkv_accum": ((2 * max_kv_tokens * num_kv_heads * plan.head_dim,),
                          torch.float32)}


__all__ = ["GQASavedSet", "GQAWorkspace", "Mode"]
