"""The forward and backward routes of the state-exchange ``-kcp`` families (GDN, KDA).

A route runs the single-rank package on this rank's fragment groups
(:func:`cake_core.kcp_state.fragment_groups`) and moves fp32 states between ranks in a fixed
order (``docs/kcp.md``):

* all-gather (:func:`forward_allgather`, :func:`backward_allgather`): the groups that send
  run first and write their summary rows (``Q`` / ``G``, with ``P`` / ``P^T`` for middle
  fragments), one all-gather posts them while the group that needs no state runs, then the
  receiving groups run from the folded states (:func:`cake_core.kcp_exchange.fold_forward`
  / ``fold_backward``);
* ring (:func:`forward_ring`, :func:`backward_ring`): chain position by chain position,
  the exact states handed on with :func:`cake_core.kcp_exchange.ring_step`.

The family supplies its single-rank calls as callables (``local_fwd``, ``transition``,
``local_bwd``, ``put``) and its own ``ring_ready``; the routes own the order of every call,
copy and collective, so both families run the same order. Plain Python and torch:
importing this module imports no Triton.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cake_core.kcp import Context, has_middle_fragments
from cake_core.kcp_exchange import (
    all_gather_rows,
    fold_backward,
    fold_forward,
    handoffs_at,
    ring_step,
)
from cake_core.kcp_state import FragmentGroups, LocalGroup

__all__ = ["backward_allgather", "backward_ring", "forward_allgather", "forward_ring"]

_F32 = torch.float32

#: ``(group, start states [n, HV, K, V] fp32 or None, output_final_state) -> (o, final
#: states, single-rank saved set)``.
LocalFwd = Callable[[LocalGroup, "torch.Tensor | None", bool], tuple]
#: ``(group, end-state gradients [n, HV, K, V] fp32 or None, the group's single-rank saved
#: set) -> the single-rank gradients (with ``dinitial_state``)``.
LocalBwd = Callable[[LocalGroup, "torch.Tensor | None", Any], Any]


def _buffer(ws, name: str, shape, device) -> torch.Tensor:
    if ws is not None:
        return ws[name]
    return torch.empty(shape, dtype=_F32, device=device)


def forward_allgather(ctx: Context, gs: FragmentGroups, ws, o: torch.Tensor, HV: int, K: int,
                      V: int, local_fwd: LocalFwd,
                      transition: Callable[[LocalGroup], torch.Tensor]):
    """The all-gather forward: fills ``o`` (each group's output put into its tokens) and
    returns ``(runs, P)``: the (group, saved set) pairs run, in order, and the middle
    fragments' transitions (``transition(gs.middle)``, or ``None``). ``ws``: the family's
    workspace (its ``fwd_send`` / ``fwd_recv``) or ``None``."""
    dev = ctx.device
    runs: list[tuple[LocalGroup, Any]] = []

    def run(grp, h0, final):
        o_g, ht, s = local_fwd(grp, h0, final)
        grp.put(o, o_g)
        runs.append((grp, s))
        return ht

    if not ctx.crosses:
        if gs.all is not None:
            run(gs.all, None, False)
        return runs, None
    mid = has_middle_fragments(ctx.partition)
    wd = K + V if mid else V
    sf = ctx.allgather_plan.fwd_slots_per_rank
    send = _buffer(ws, "fwd_send", (sf, HV, K, wd), dev)
    recv = _buffer(ws, "fwd_recv", (ctx.world_size * sf, HV, K, wd), dev)
    send.zero_()
    if gs.first is not None:  # from zero: its end states are its Q
        ht = run(gs.first, None, True)
        for j, fi in enumerate(gs.first.frags):
            send[gs.send_index[fi], ..., wd - V:] = ht[j]
    P = None
    if gs.middle is not None:
        _, Q, _ = local_fwd(gs.middle, None, True)
        P = transition(gs.middle)
        for j, fi in enumerate(gs.middle.frags):
            send[gs.send_index[fi], ..., :K] = P[j]
            send[gs.send_index[fi], ..., K:] = Q[j]
    pending = all_gather_rows(send, recv, ctx)
    if gs.alone is not None:  # needs no state: overlaps the all-gather
        run(gs.alone, None, False)
    pending.wait()
    start = fold_forward(ctx, recv, K, mid,
                         torch.empty((len(ctx.recv), HV, K, V), dtype=_F32, device=dev))
    for grp in (gs.middle, gs.last):
        if grp is not None:
            run(grp, start[[gs.recv_index[fi] for fi in grp.frags]], False)
    return runs, P


def forward_ring(ctx: Context, gs: FragmentGroups, ws, o: torch.Tensor, HV: int, K: int,
                 V: int, local_fwd: LocalFwd, transition: Callable[[LocalGroup], torch.Tensor],
                 ring_ready: Callable[[Context], None]):
    """The ring forward (the all-gather route's single call when nothing crosses): fills
    ``o`` and returns the (group, saved set) pairs run, in order. ``ring_ready(ctx)`` runs
    before the first step."""
    if not ctx.crosses:
        return forward_allgather(ctx, gs, ws, o, HV, K, V, local_fwd, transition)[0]
    dev = ctx.device
    runs: list[tuple[LocalGroup, Any]] = []
    ring_ready(ctx)
    steps = handoffs_at(ctx)
    end: dict[int, torch.Tensor] = {}
    start: dict[int, torch.Tensor] = {}
    for c in range(ctx.ring_plan.num_steps + 1):
        if c > 0:
            for h in steps.get(c - 1, ()):
                if h.dst_rank == ctx.rank:
                    start[h.dst_fragment] = torch.empty((HV, K, V), dtype=_F32, device=dev)
            ring_step(ctx, steps.get(c - 1, []), end, start, backward=False)
        grp = gs.by_pos.get(c)
        if grp is None:
            continue
        frags = [ctx.fragments[i] for i in grp.frags]
        h0 = torch.stack([start.pop(i) for i in grp.frags]) if c > 0 else None
        o_g, ht, s = local_fwd(grp, h0, any(f.has_next for f in frags))
        grp.put(o, o_g)
        runs.append((grp, s))
        for j, (i, f) in enumerate(zip(grp.frags, frags, strict=True)):
            if f.has_next:
                end[i] = ht[j]
    return runs


def local_saved(saved) -> dict[str, Any]:
    """A KCP saved set's nested single-rank saved sets by group kind."""
    return {kind: s for (kind, _), s in zip(saved.groups, saved.local, strict=True)}


def backward_allgather(ctx: Context, gs: FragmentGroups, ws, saved, local_bwd: LocalBwd,
                       put: Callable[[LocalGroup, Any], None]) -> None:
    """The all-gather backward of a KCP saved set (``qk_shape``, ``v``, ``P``,
    ``has_middle``, its nested sets by group): each group's single-rank gradients handed
    to ``put(group, gradients)``, in the route's order."""
    HV, K, V = saved.v.shape[2], saved.qk_shape[3], saved.v.shape[3]
    dev = ctx.device
    local = local_saved(saved)
    if not ctx.crosses:
        if gs.all is not None:
            put(gs.all, local_bwd(gs.all, None, local["all"]))
        return
    mid = saved.has_middle
    wd = K + V if mid else V
    sb = ctx.allgather_plan.bwd_slots_per_rank
    send = _buffer(ws, "bwd_send", (sb, HV, K, wd), dev)
    recv = _buffer(ws, "bwd_recv", (ctx.world_size * sb, HV, K, wd), dev)
    send.zero_()
    if gs.last is not None:  # complete (no state leaves these fragments), and their G
        gr = local_bwd(gs.last, None, local["last"])
        put(gs.last, gr)
        for j, fi in enumerate(gs.last.frags):
            send[gs.recv_index[fi], ..., wd - V:] = gr.dinitial_state[j]
    if gs.middle is not None:  # G only; the gradients come from the run with dht below
        gr = local_bwd(gs.middle, None, local["middle"])
        for j, fi in enumerate(gs.middle.frags):
            send[gs.recv_index[fi], ..., :K] = saved.P[j].transpose(-1, -2)
            send[gs.recv_index[fi], ..., K:] = gr.dinitial_state[j]
        del gr
    pending = all_gather_rows(send, recv, ctx)
    if gs.alone is not None:  # needs no state gradient: overlaps the all-gather
        put(gs.alone, local_bwd(gs.alone, None, local["alone"]))
    pending.wait()
    dend = fold_backward(ctx, recv, K, mid,
                         torch.empty((len(ctx.send), HV, K, V), dtype=_F32, device=dev))
    for grp in (gs.first, gs.middle):
        if grp is not None:
            dht = dend[[gs.send_index[fi] for fi in grp.frags]]
            put(grp, local_bwd(grp, dht, local[grp.kind]))


def backward_ring(ctx: Context, gs: FragmentGroups, ws, saved, local_bwd: LocalBwd,
                  put: Callable[[LocalGroup, Any], None],
                  ring_ready: Callable[[Context], None]) -> None:
    """The ring backward (the all-gather route's single call when nothing crosses), chain
    positions last first; ``ring_ready(ctx)`` runs before the first step."""
    if not ctx.crosses:
        return backward_allgather(ctx, gs, ws, saved, local_bwd, put)
    HV, K, V = saved.v.shape[2], saved.qk_shape[3], saved.v.shape[3]
    dev = ctx.device
    local = local_saved(saved)
    ring_ready(ctx)
    steps = handoffs_at(ctx)
    dend: dict[int, torch.Tensor] = {}
    dstart: dict[int, torch.Tensor] = {}
    for c in range(ctx.ring_plan.num_steps, -1, -1):
        grp = gs.by_pos.get(c)
        if grp is not None:
            frags = [ctx.fragments[i] for i in grp.frags]
            dht = None
            if any(f.has_next for f in frags):
                dht = torch.stack([dend.pop(i) if f.has_next else
                                   torch.zeros((HV, K, V), dtype=_F32, device=dev)
                                   for i, f in zip(grp.frags, frags, strict=True)])
            gr = local_bwd(grp, dht, local[grp.kind])
            put(grp, gr)
            if c > 0:
                for j, i in enumerate(grp.frags):
                    dstart[i] = gr.dinitial_state[j]
        if c > 0:
            for h in steps.get(c - 1, ()):
                if h.src_rank == ctx.rank:
                    dend[h.src_fragment] = torch.empty((HV, K, V), dtype=_F32, device=dev)
            ring_step(ctx, steps.get(c - 1, []), dstart, dend, backward=True)
    return None
