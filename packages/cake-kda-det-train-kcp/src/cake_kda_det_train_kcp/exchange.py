"""The collectives and the fixed-order fp32 folds of the KDA KCP route.

* all-gather (:func:`all_gather_rows`): one asynchronous ``torch.distributed.all_gather`` of
  a padded ``[S, HV, K, Wd]`` fp32 buffer into the ``W`` views of a ``[W * S, ...]`` one
  (rank order), then :func:`fold_forward` / :func:`fold_backward`: the affine folds of
  :class:`cake_core.kcp.AllGatherPlan` in its fixed order, ``torch.baddbmm`` in fp32;
* ring (:func:`ring_step`): the exact states of one step of :class:`cake_core.kcp.RingPlan`,
  posted together with ``torch.distributed.batch_isend_irecv`` in the plan's ``(step, doc)``
  order (the same order on both sides of every pair);
* gate-parameter gradients (:func:`sum_over_ranks`): one all-gather of each rank's fp32
  share, then a sum in rank order, so every rank holds the same bits.

No all-reduce and no sum whose order depends on arrival anywhere: every rank folds and sums
the same rows in the same order.
"""

from __future__ import annotations

import weakref

import torch.distributed as dist
from cake_core.kcp import Context
from cake_core.kcp_exchange import (
    all_gather_rows,
    fold_backward,
    fold_forward,
    handoffs_at,
    ring_step,
    sum_over_ranks,
)

__all__ = ["all_gather_rows", "fold_backward", "fold_forward", "handoffs_at", "ring_ready",
           "ring_step", "sum_over_ranks"]

# The collectives and folds live in cake_core.kcp_exchange (shared with the other
# state-exchange -kcp families); this package keeps its own ring warm-up registry.

_RING_READY: weakref.WeakSet[Context] = weakref.WeakSet()


def ring_ready(ctx: Context) -> None:
    """Before a context's first ring step: one barrier over ``ctx.group`` (every rank calls
    the entry, so every rank joins). ``batch_isend_irecv`` between a subset of ranks is
    undefined as a group's first collective on NCCL (torch's note); after this it is not.
    Once per context; nothing in a single process without ``torch.distributed``."""
    if ctx in _RING_READY:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=ctx.group)
    _RING_READY.add(ctx)
