"""Partitions and contexts of the KCP route (thin wrappers over :mod:`cake_core.kcp`), the
checks every entry runs on a context before any collective, and the local token groups
the entries hand to the single-rank kernels.

Plain Python and torch: importing this module imports no Triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from cake_core import kcp as _kcp
from cake_core.kcp import Context, Partition, check_context, has_middle_fragments
from cake_core.kcp_state import LocalGroup

__all__ = [
    "LocalGroup",
    "build_context_det_kcp",
    "check_context",
    "comm_bytes",
    "has_middle_fragments",
    "partition_det_kcp",
]


def partition_det_kcp(cu_seqlens_global_cpu: torch.Tensor | Sequence[int], world_size: int,
                      layout: str = "contiguous",
                      fragments: Sequence[object] | None = None) -> Partition:
    """Which global tokens each rank of a context-parallel group holds.

    A thin wrapper over :class:`cake_core.kcp.Partition` (``docs/kcp.md``): built on the
    host from the global offsets, equal on every rank, reusable by every layer.

    Args:
        cu_seqlens_global_cpu: the global document offsets ``[N + 1]`` of the packed batch
            (int32/int64 CPU tensor or a sequence of ints; starts at 0, non-decreasing;
            empty documents allowed); ``T = cu_seqlens[-1]``.
        world_size: ``W >= 1``, the size of the context-parallel group.
        layout: ``"contiguous"`` (rank ``r`` holds ``[floor(rT/W), floor((r+1)T/W))``),
            ``"zigzag"`` (``2W`` parts cut the same way, rank ``r`` holds parts ``r`` and
            ``2W-1-r``) or ``"zigzag_per_document"`` (every document in ``2W`` parts, rank
            ``r`` holds its parts ``r`` and ``2W-1-r``). Nothing needs to divide;
            ranks may hold no token.
        fragments: an explicit fragment table instead of a layout: rows
            ``(rank, doc, doc_offset, length)`` (or mappings with those keys, or
            :class:`cake_core.kcp.Fragment` objects); a rank's rows in table order are its
            local order (:meth:`cake_core.kcp.Partition.from_fragments`). ``layout`` must
            then be left at its default (or be ``"explicit"``).

    Returns:
        a :class:`cake_core.kcp.Partition`.

    Raises:
        ValueError: bad offsets, world size, layout, or fragment table (naming the
            argument), ``layout="zigzag"`` together with ``fragments``.
    """
    return _kcp.partition_det_kcp(cu_seqlens_global_cpu, world_size, layout, fragments)


def build_context_det_kcp(partition: Partition, group: Any, rank: int,
                          device: torch.device | str | int, conv_kernel_size: int = 4, *,
                          exchange: str = "allgather") -> Context:
    """Rank ``rank``'s view of ``partition`` for the KCP entries of this package.

    A thin wrapper over :func:`cake_core.kcp.build_context` (it reads no tensor contents
    and runs no collective; it asks ``torch.distributed`` for the group's size and this
    process's rank, which are local queries).

    Args:
        partition: from :func:`partition_det_kcp` (the same on every rank).
        group: the context-parallel process group, or ``None``: the default group when
            ``torch.distributed`` is initialised, else a single process (``W`` must be 1).
        rank: this process's rank in ``group``.
        device: where the rank-local tensors live.
        conv_kernel_size: the causal convolution's width (the halo plan; unused by GDN).
        exchange: ``"allgather"`` (default: one all-gather of fp32 affine summaries per
            direction) or ``"ring"`` (the exact states handed along each document's chain).

    Raises:
        ValueError: a partition made for another world size than the group's, ``rank``
            not this process's rank in ``group``, an unknown ``exchange``, ... (see
            :func:`cake_core.kcp.build_context`).
    """
    return _kcp.build_context_det_kcp(partition, group, rank, device, conv_kernel_size,
                                      exchange=exchange)



def comm_bytes(ctx: Context, K: int, V: int, HV: int) -> dict[str, int]:
    """Bytes this package's collectives send and receive on ``ctx``'s rank per training step of
    one layer (forward + backward), fp32: the all-gather rows are ``HV * K * (K + V) * 4`` bytes
    when the partition has middle fragments (:func:`has_middle_fragments`), else
    ``HV * K * V * 4`` (cake_core's :meth:`~cake_core.kcp.Context.bytes_per_collective` counts
    the wider row); the ring's states are ``HV * K * V * 4`` bytes. Keys: ``fwd_sent``,
    ``fwd_received``, ``bwd_sent``, ``bwd_received``, ``calls`` (collective calls or
    point-to-point operations, both directions). Steady state: the first call of each entry on a
    context (the forward's and the backward's) adds one all-gather of 16 bytes per rank, the
    ranks' agreement (:func:`cake_core.kcp.agree_once`), not counted here.

    Example: ``comm_bytes(ctx, 128, 128, 32)["fwd_received"]``.
    """
    if ctx.exchange == "allgather":
        plan = ctx.allgather_plan
        row = HV * K * (K + V if has_middle_fragments(ctx.partition) else V) * 4
        w = ctx.world_size
        sf, sb = plan.fwd_slots_per_rank, plan.bwd_slots_per_rank
        return {"fwd_sent": sf * row, "fwd_received": (w - 1) * sf * row,
                "bwd_sent": sb * row, "bwd_received": (w - 1) * sb * row,
                "calls": int(sf > 0) + int(sb > 0)}
    b = ctx.bytes_per_collective(K, V, HV, torch.float32)
    return {"fwd_sent": b.fwd_sent, "fwd_received": b.fwd_received, "bwd_sent": b.bwd_sent,
            "bwd_received": b.bwd_received, "calls": b.fwd_calls + b.bwd_calls}


# ----------------------------------------------------------------------------- local groups
