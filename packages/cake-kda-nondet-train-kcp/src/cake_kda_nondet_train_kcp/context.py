"""Partitions, contexts and byte counts of the nondet KDA KCP route: cake-kda-det-train-kcp's
(thin wrappers over :mod:`cake_core.kcp`; a partition and a context carry no mode, so one
serves both packages).

Plain Python and torch: importing this module imports no Triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from cake_core.kcp import Context, Partition
from cake_kda_det_train_kcp.context import (
    build_context_det_kcp,
    comm_bytes,
    partition_det_kcp,
)

__all__ = ["build_context_nondet_kcp", "comm_bytes_nondet", "partition_nondet_kcp"]


def partition_nondet_kcp(cu_seqlens_global_cpu: torch.Tensor | Sequence[int],
                         world_size: int, layout: str = "contiguous",
                         fragments: Sequence[object] | None = None) -> Partition:
    """Which global tokens each rank of a context-parallel group holds: a
    :class:`cake_core.kcp.Partition`, as ``cake_kda_det_train_kcp.partition_det_kcp``
    builds it (arguments, layouts ``"contiguous"`` / ``"zigzag"`` / an explicit
    ``fragments`` table, and errors there).

    Raises:
        ValueError: bad offsets, world size, layout or fragment table.
    """
    return partition_det_kcp(cu_seqlens_global_cpu, world_size, layout, fragments)


def build_context_nondet_kcp(partition: Partition, group: Any, rank: int,
                             device: torch.device | str | int, conv_kernel_size: int = 4, *,
                             exchange: str = "allgather") -> Context:
    """Rank ``rank``'s view of ``partition`` for this package's KCP entries: a
    :class:`cake_core.kcp.Context`, as ``cake_kda_det_train_kcp.build_context_det_kcp``
    builds it (``exchange``: ``"allgather"`` or ``"ring"``; no collective, no tensor read).

    Raises:
        ValueError: as ``build_context_det_kcp``.
    """
    return build_context_det_kcp(partition, group, rank, device, conv_kernel_size,
                                 exchange=exchange)


def comm_bytes_nondet(ctx: Context, K: int, V: int, HV: int, *,
                      gate_grad_floats: int = 0) -> dict[str, int]:
    """Bytes this package's collectives send and receive on ``ctx``'s rank per training step of
    one layer (forward + backward), fp32: ``cake_kda_det_train_kcp.comm_bytes`` (the same
    exchange). Steady state: the first call of each entry on a context (the forward's and the
    backward's) adds one all-gather of 16 bytes per rank, the ranks' agreement
    (:func:`cake_core.kcp.agree_once`), not counted here.

    Example: ``comm_bytes_nondet(ctx, 128, 128, 32)["calls"]``.

    Returns:
        ``{"fwd_sent", "fwd_received", "bwd_sent", "bwd_received", "calls"}``.
    """
    return comm_bytes(ctx, K, V, HV, gate_grad_floats=gate_grad_floats)
