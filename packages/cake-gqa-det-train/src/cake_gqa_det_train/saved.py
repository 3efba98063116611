"""GQADetSavedSet (what the forward keeps for the backward) and GQADetWorkspace."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace, check_int
from cake_core.checks import check_alloc_device

from cake_gqa_det_train.plan import GQADetPlan


class GQADetSavedSet(SavedSet):
    """What :func:`~cake_gqa_det_train.gqa_det_fwd` returns for
    :func:`~cake_gqa_det_train.gqa_det_bwd`.

    Tensors: ``q`` ``[Tq, Hq, D]``, ``k`` / ``v`` ``[Tk, Hkv, D]`` (packed views of the
    inputs), ``out`` ``[Tq, Hq, D]``, ``lse`` ``[Hq, Tq]`` fp32, ``cu_seqlens_q`` /
    ``cu_seqlens_k`` (``None`` for fixed-length input). Meta: ``plan``, ``ints`` (the
    kernels' ``(seq_q, seq_k, n_docs, max_q, max_k, left, right)``: fixed lengths or -1,
    documents, longest documents, the window with causal folded in), ``scale``,
    ``softcap``, ``problem`` (the checked call) and ``shapes`` (the caller's q, k, v
    shapes).
    """

    tensor_names = ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
    format_version = 1


class GQADetWorkspace(Workspace):
    """The backward's fp32 scratch for one plan: ``delta`` (rowsum(dO * O) per query head
    and token), room for ``num_heads * max_tokens`` values.

    Build with :meth:`for_plan`; a backward of more heads x tokens than it holds, or of
    another plan or mode, is refused with ``ValueError``. Every backward overwrites what it
    uses (nothing carries over); one workspace serves one backward at a time.
    """

    @classmethod
    def for_plan(cls, plan: GQADetPlan, device: torch.device | str, num_heads: int,
                 max_tokens: int) -> GQADetWorkspace:
        """Allocate room for ``num_heads`` query heads of ``max_tokens`` query tokens
        (:func:`~cake_gqa_det_train.workspace_bytes` gives its bytes without allocating)."""
        device = check_alloc_device(device)
        shapes = workspace_shapes(plan, num_heads, max_tokens)
        return cls(plan, device, {n: torch.empty(shape, dtype=dtype, device=device)
                                  for n, (shape, dtype) in shapes.items()})


def workspace_shapes(plan: GQADetPlan, num_heads: int, max_tokens: int) -> dict:
    """``{name: (shape, dtype)}`` of :meth:`GQADetWorkspace.for_plan`'s buffers, after its
    argument checks (``ValueError``); what it allocates and ``workspace_bytes`` counts."""
    if not isinstance(plan, GQADetPlan):
        raise ValueError(f"plan: expected GQADetPlan, got {type(plan).__name__}")
    num_heads = check_int(num_heads, "num_heads", 1)
    max_tokens = check_int(max_tokens, "max_tokens", 0)
    return {"delta": ((num_heads * max_tokens,), torch.float32)}


__all__ = ["GQADetSavedSet", "GQADetWorkspace", "Mode"]
