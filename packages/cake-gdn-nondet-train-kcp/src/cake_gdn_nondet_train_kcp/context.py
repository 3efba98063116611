"""Partitions and contexts of the KCP route: cake-gdn-det-train-kcp's (a partition and a
context carry no mode, so one serves the routes of both packages).

Plain Python and torch: importing this module imports no Triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from cake_core import kcp as _kcp
from cake_core.kcp import Context, Partition
from cake_gdn_det_train_kcp.context import comm_bytes as _comm_bytes

__all__ = ["build_context_nondet_kcp", "comm_bytes_nondet", "partition_nondet_kcp"]


def partition_nondet_kcp(cu_seqlens_global_cpu: torch.Tensor | Sequence[int], world_size: int,
                         layout: str = "contiguous",
                         fragments: Sequence[object] | None = None) -> Partition:
    """Which global tokens each rank of a context-parallel group holds: arguments, result
    and errors as ``cake_gdn_det_train_kcp.partition_det_kcp`` (a
    :class:`cake_core.kcp.Partition`; ``layout`` ``"contiguous"`` or ``"zigzag"``, or an
    explicit ``fragments`` table of ``(rank, doc, doc_offset, length)`` rows).

    Raises:
        ValueError: bad offsets, world size, layout or fragment table.
    """
    return _kcp.partition_det_kcp(cu_seqlens_global_cpu, world_size, layout, fragments)


def build_context_nondet_kcp(partition: Partition, group: Any, rank: int,
                             device: torch.device | str | int, conv_kernel_size: int = 4, *,
                             exchange: str = "allgather") -> Context:
    """Rank ``rank``'s view of ``partition`` for this package's entries: arguments, result
    and errors as ``cake_gdn_det_train_kcp.build_context_det_kcp`` (``exchange``
    ``"allgather"`` or ``"ring"``; ``group`` ``None`` for the default group, or one
    process with world size 1).

    Raises:
        ValueError: a partition for another world size, ``rank`` not this process's rank
            in ``group``, an unknown ``exchange``.
    """
    return _kcp.build_context_det_kcp(partition, group, rank, device, conv_kernel_size,
                                      exchange=exchange)


def comm_bytes_nondet(ctx: Context, K: int, V: int, HV: int) -> dict[str, int]:
    """Bytes this package's collectives send and receive on ``ctx``'s rank per training step of
    one layer (forward + backward): ``cake_gdn_det_train_kcp.comm_bytes`` (the same route).
    Keys: ``fwd_sent``, ``fwd_received``, ``bwd_sent``, ``bwd_received``, ``calls``. Steady
    state: the first call of each entry on a context (the forward's and the backward's) adds one
    all-gather of 16 bytes per rank, the ranks' agreement (:func:`cake_core.kcp.agree_once`),
    not counted here.

    Example: ``comm_bytes_nondet(ctx, 128, 128, 32)["bwd_sent"]``.
    """
    return _comm_bytes(ctx, K, V, HV)
