"""The collectives and the fixed-order fp32 folds of the state-exchange ``-kcp`` families
(GDN, KDA; each package's ``exchange`` module re-exports them).

* all-gather (:func:`all_gather_rows`): one asynchronous ``torch.distributed.all_gather`` of
  a padded ``[S, HV, K, Wd]`` fp32 buffer into the ``W`` views of a ``[W * S, ...]`` one
  (rank order), then :func:`fold_forward` / :func:`fold_backward`: the affine folds of
  :class:`cake_core.kcp.AllGatherPlan` in its fixed order, ``torch.baddbmm`` in fp32;
* ring (:func:`ring_step`): the exact states of one step of :class:`cake_core.kcp.RingPlan`,
  posted together with ``torch.distributed.batch_isend_irecv`` in the plan's ``(step, doc)``
  order (the same order on both sides of every pair); each package keeps its own
  ``ring_ready`` (the barrier before a context's first ring step);
* sums over ranks (:func:`sum_over_ranks`, KDA's gate-parameter gradients): one all-gather
  of each rank's fp32 share, then a sum in rank order, so every rank holds the same bits.

No all-reduce and no sum whose order depends on arrival anywhere: every rank folds and sums
the same rows in the same order. Plain Python and torch: importing this module imports no
Triton.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cake_core.kcp import Context, Handoff

__all__ = ["all_gather_rows", "fold_backward", "fold_forward", "handoffs_at", "ring_step",
           "sum_over_ranks"]


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


class _Done:
    """The handle of a gather that completed synchronously (a single process)."""

    def wait(self) -> None:
        return None


def all_gather_rows(send: torch.Tensor, recv: torch.Tensor, ctx: Context):
    """Post ``recv[r * S + i] = send_r[i]`` for every rank ``r`` of ``ctx.group`` (``send``
    ``[S, ...]`` contiguous, ``recv`` ``[W * S, ...]`` contiguous) and return a handle whose
    ``wait()`` completes it (``torch.distributed.all_gather(..., async_op=True)``: work
    needing no gathered row may run meanwhile; neither buffer may be touched before
    ``wait()``). A single process without ``torch.distributed`` (``W = 1``) copies."""
    W = ctx.world_size
    if W == 1 and not _dist_on():
        recv.copy_(send)
        return _Done()
    outs = list(recv.view(W, *send.shape).unbind(0))
    return dist.all_gather(outs, send, group=ctx.group, async_op=True)


def _check_width(entries, K: int, V: int, wd: int, with_p: bool) -> None:
    if wd != (K + V if with_p else V):
        raise AssertionError(f"summary rows are {wd} wide, expected {K + V if with_p else V}")
    if not with_p and any(len(e.gather_sources) > 1 for e in entries):
        raise AssertionError("a chain of three or more fragments needs the transitions P")


def fold_forward(ctx: Context, rows: torch.Tensor, K: int, with_p: bool,
                 out: torch.Tensor) -> torch.Tensor:
    """Start state of each of ``ctx.recv``'s fragments into ``out[i]`` (fp32 ``[n_recv, HV,
    K, V]``): ``S = Q_first``, then ``S = P_row @ S + Q_row`` over the rest of
    ``RecvEntry.gather_sources``, in order. ``rows`` ``[W * S_f, HV, K, Wd]``: ``P``
    (``[HV, K, K]``, acting on the key dim of the state) in ``[..., :K]`` when ``with_p``,
    ``Q`` in the last ``V`` columns."""
    V, wd = out.shape[-1], rows.shape[-1]
    _check_width(ctx.recv, K, V, wd, with_p)
    for i, e in enumerate(ctx.recv):
        src = e.gather_sources
        s = rows[src[0], ..., wd - V:]
        for r in src[1:]:
            s = torch.baddbmm(rows[r, ..., wd - V:], rows[r, ..., :K], s)
        out[i].copy_(s)
    return out


def fold_backward(ctx: Context, rows: torch.Tensor, K: int, with_p: bool,
                  out: torch.Tensor) -> torch.Tensor:
    """Gradient of the end state of each of ``ctx.send``'s fragments into ``out[i]`` (fp32
    ``[n_send, HV, K, V]``): ``D = G_first``, then ``D = Pt_row @ D + G_row`` over the rest
    of ``SendEntry.gather_sources`` (the later fragments, last first). ``rows`` ``[W * S_b,
    HV, K, Wd]``: ``P^T`` in ``[..., :K]`` when ``with_p``, ``G`` in the last ``V``
    columns."""
    V, wd = out.shape[-1], rows.shape[-1]
    _check_width(ctx.send, K, V, wd, with_p)
    for i, e in enumerate(ctx.send):
        src = e.gather_sources
        d = rows[src[0], ..., wd - V:]
        for r in src[1:]:
            d = torch.baddbmm(rows[r, ..., wd - V:], rows[r, ..., :K], d)
        out[i].copy_(d)
    return out


def sum_over_ranks(share: torch.Tensor, ctx: Context) -> torch.Tensor:
    """The sum over the ranks of ``ctx.group`` of each rank's fp32 ``share`` ``[n]``, equal
    bits on every rank: one all-gather into ``[W, n]``, then ``s = row_0; s = s + row_r`` for
    ``r = 1 .. W-1`` in rank order (never an all-reduce, whose order is the backend's).
    A single process without ``torch.distributed`` returns ``share`` itself."""
    W = ctx.world_size
    if W == 1 and not _dist_on():
        return share
    rows = torch.empty((W, share.numel()), dtype=share.dtype, device=share.device)
    all_gather_rows(share.reshape(1, -1).contiguous(), rows, ctx).wait()
    s = rows[0].clone()
    for r in range(1, W):
        s.add_(rows[r])
    return s


def handoffs_at(ctx: Context) -> dict[int, list[Handoff]]:
    """This rank's ring hand-offs by step, each list in the plan's ``(step, doc)`` order."""
    by_step: dict[int, list[Handoff]] = {}
    for h in ctx.ring_plan.for_rank(ctx.rank):
        by_step.setdefault(h.step, []).append(h)
    return by_step


def _peer(ctx: Context, group_rank: int) -> int:
    """The global rank ``P2POp`` takes for rank ``group_rank`` of ``ctx.group``."""
    if ctx.group is None or ctx.group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(ctx.group, group_rank)


def ring_step(ctx: Context, handoffs: list[Handoff], have: dict[int, torch.Tensor],
              want: dict[int, torch.Tensor], *, backward: bool) -> None:
    """One ring step. Forward: for each hand-off the source rank sends ``have[src_fragment]``
    (an end state) and the destination receives it into ``want[dst_fragment]``. Backward
    (``backward=True``): the destination sends ``have[dst_fragment]`` (a start-state
    gradient) and the source receives it into ``want[src_fragment]``. A hand-off from this
    rank to itself is a copy. Sends and receives are posted together, in ``handoffs`` order
    on both sides, and waited for before returning."""
    me = ctx.rank
    ops = []
    for h in handoffs:
        if backward:
            a_rank, a_frag, b_rank, b_frag = h.dst_rank, h.dst_fragment, h.src_rank, \
                h.src_fragment
        else:
            a_rank, a_frag, b_rank, b_frag = h.src_rank, h.src_fragment, h.dst_rank, \
                h.dst_fragment
        if a_rank == me and b_rank == me:
            want[b_frag].copy_(have[a_frag])
        elif a_rank == me:
            ops.append(dist.P2POp(dist.isend, have[a_frag], _peer(ctx, b_rank), ctx.group))
        elif b_rank == me:
            ops.append(dist.P2POp(dist.irecv, want[b_frag], _peer(ctx, a_rank), ctx.group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()
