"""The collectives of the KCP route and the fixed-order sums around them.

* :func:`all_gather_bytes`: one ``torch.distributed.all_gather`` of a byte row per rank
  into the rank-ordered views of one ``[W, n]`` buffer. Halo rows travel as the bytes of
  the input dtype (copies, exact for every dtype and backend); the weight-gradient shares
  as the bytes of fp32 values.
* :func:`rank_order_sum`: the shares summed in rank order, ``((s_0 + s_1) + s_2) + ...``,
  in fp32: every rank adds the same rows in the same order, so every rank gets the same
  bits (never an all-reduce, whose order is the backend's).
* :func:`add_in_rounds`: halo gradients added to the input gradient in a fixed order.

No sum anywhere depends on arrival order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from cake_core.kcp import Context

__all__ = ["add_in_rounds", "all_gather_bytes", "rank_order_sum"]


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_gather_bytes(send: torch.Tensor, recv: torch.Tensor, ctx: Context) -> None:
    """``recv[r] = send_r`` for every rank ``r`` of ``ctx.group`` (``send``: uint8 ``[n]``
    contiguous, ``recv``: uint8 ``[W, n]`` contiguous), waited for before returning. A
    single process without ``torch.distributed`` (``W = 1``) copies."""
    W = ctx.world_size
    if W == 1 and not _dist_on():
        recv[0].copy_(send)
        return
    dist.all_gather(list(recv.unbind(0)), send, group=ctx.group)


def rank_order_sum(rows: torch.Tensor) -> torch.Tensor:
    """fp32 ``rows`` ``[W, n]`` summed over ranks in rank order (a new ``[n]`` tensor):
    ``s = rows[0]; s = s + rows[1]; ...``. With ``W = 1`` a copy of ``rows[0]``."""
    s = rows[0].clone()
    for r in range(1, rows.shape[0]):
        s.add_(rows[r])
    return s


def add_in_rounds(dx: torch.Tensor, touched: torch.Tensor,
                  rounds: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                  pool: torch.Tensor) -> None:
    """``dx[0, touched[i]] += pool[p]`` for every ``(i, p)`` of every round, in round order,
    in fp32, one cast back at the end. Within a round each ``i`` appears at most once (no
    duplicate index, no scatter-add), so each row's additions run in the rounds' order:
    its local gradient first, then the halo contributions in document order."""
    if touched.numel() == 0:
        return
    acc = dx[0, touched].float()
    for pos, src in rounds:
        acc[pos] = acc[pos] + pool[src].float()
    dx[0, touched] = acc.to(dx.dtype)
