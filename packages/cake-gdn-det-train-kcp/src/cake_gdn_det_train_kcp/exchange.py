"""The collectives and the fixed-order fp32 folds of the KCP route.

* all-gather (:func:`all_gather_rows`): one asynchronous ``torch.distributed.all_gather`` of
  a padded ``[S, HV, K, Wd]`` fp32 buffer into the views of a ``[W * S, ...]`` one (rank
  order), then
  :func:`fold_forward` / :func:`fold_backward`, the affine folds of
  :class:`cake_core.kcp.AllGatherPlan` in its fixed order, with ``torch.baddbmm`` in fp32;
* ring (:func:`ring_step`): the exact states of one step of :class:`cake_core.kcp.RingPlan`,
  sent and received together with ``torch.distributed.batch_isend_irecv`` in the plan's
  ``(step, doc)`` order (the same order on both sides of every pair).

No all-reduce and no sum whose order depends on arrival anywhere: every rank folds the
same rows in the same order.
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
)

__all__ = ["all_gather_rows", "fold_backward", "fold_forward", "handoffs_at", "ring_ready",
           "ring_step"]

# The collectives and folds live in cake_core.kcp_exchange (shared with the other
# state-exchange -kcp families); this package keeps its own ring warm-up registry.

_RING_READY: weakref.WeakSet[Context] = weakref.WeakSet()


def ring_ready(ctx: Context) -> None:
    """Before a context's first ring step: one barrier over ``ctx.group`` (every rank calls
    the entry, so every rank joins). ``batch_isend_irecv`` between a subset of ranks is
    undefined as the group's first collective on NCCL (torch's note); after this it is not.
    Once per context; nothing in a single process without ``torch.distributed``."""
    if ctx in _RING_READY:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=ctx.group)
    _RING_READY.add(ctx)
