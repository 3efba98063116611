"""Partitions and contexts of the KCP route (thin wrappers over :mod:`cake_core.kcp`), the
checks every entry runs on a context before any collective, and the halo plan: where each
halo row comes from and where its gradient goes, as fixed index lists.

Plain Python and torch: importing this module imports no Triton.

The halo of a fragment with a predecessor (:class:`cake_core.kcp.HaloEntry`) is the
``Wc - 1`` input rows just before it in its document, right-aligned, zero before the
document start; its pieces may come from this rank or from several earlier ranks (when
fragments are shorter than the halo). This package moves them with **one all-gather per
direction** of fixed-size rows (the padded all-gather ``docs/kcp.md`` allows instead of
point-to-point messages):

* forward: rank ``r`` packs the rows it gives other ranks (``ctx.halo_send`` order) into
  ``S_f`` rows (the maximum over ranks; unused rows zero); after the all-gather the row
  ``k`` of rank ``s`` is gathered row ``s * S_f + k``;
* backward: rank ``r`` packs the gradients of the halo rows it received from other ranks
  (its halo entries in local order, their pieces in document order) into ``S_b`` rows;
  the rank that sent a row finds its gradient at ``dst * S_b + k`` and adds it to that
  token's input gradient. A token can sit in the halos of up to ``Wc - 1`` later
  fragments; its contributions are added in the order of those fragments' global
  positions (document order), after the local gradient: a fixed order, whatever the
  arrival order.

Everything here is a pure function of the partition and the kernel size, so every rank
derives the same sizes and skips a collective together when nothing crosses a rank.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from cake_core import kcp as _kcp
from cake_core.kcp import Context, HaloEntry, HaloPiece, HaloSend, Partition, check_context

__all__ = [
    "HaloPlan",
    "RankHalo",
    "build_context_det_kcp",
    "check_context",
    "device_halo",
    "comm_bytes",
    "halo_plan",
    "halo_tables",
    "partition_det_kcp",
]


def partition_det_kcp(cu_seqlens_global_cpu: torch.Tensor | Sequence[int], world_size: int,
                      layout: str = "contiguous",
                      fragments: Sequence[object] | None = None) -> Partition:
    """Which global tokens each rank of a context-parallel group holds.

    A thin wrapper over :class:`cake_core.kcp.Partition` (``docs/kcp.md``): built on the
    host from the global offsets, equal on every rank, reusable by every layer (the same
    object the other ``-kcp`` families take).

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
            argument), a layout other than the default together with ``fragments``.
    """
    return _kcp.partition_det_kcp(cu_seqlens_global_cpu, world_size, layout, fragments)


def build_context_det_kcp(partition: Partition, group: Any, rank: int,
                          device: torch.device | str | int, conv_kernel_size: int = 4, *,
                          exchange: str = "allgather") -> Context:
    """Rank ``rank``'s view of ``partition`` for the KCP entries of this package.

    A thin wrapper over :func:`cake_core.kcp.build_context` (reads no tensor contents, runs
    no collective; it asks ``torch.distributed`` for the group's size and this process's
    rank, which are local queries). The same context serves the other ``-kcp`` families
    of a layer stack (a GDN layer and its short convolutions share one).

    Args:
        partition: from :func:`partition_det_kcp` (the same on every rank).
        group: the context-parallel process group, or ``None``: the default group when
            ``torch.distributed`` is initialised, else a single process (``W`` must be 1).
        rank: this process's rank in ``group``.
        device: where the rank-local tensors live.
        conv_kernel_size: the convolution's width ``Wc`` (2..8 for this package's entries,
            which refuse a context whose width differs from the weight's); it fixes the
            halo of ``Wc - 1`` rows.
        exchange: the state exchange of the delta-rule families (``"allgather"`` or
            ``"ring"``); this package always moves the halo by all-gather and ignores it.

    Raises:
        ValueError: a partition made for another world size than the group's, ``rank``
            not this process's rank in ``group``, a bad ``conv_kernel_size`` or
            ``exchange``, ... (see :func:`cake_core.kcp.build_context`).
    """
    return _kcp.build_context_det_kcp(partition, group, rank, device, conv_kernel_size,
                                      exchange=exchange)



# ----------------------------------------------------------------------------- halo plan


@dataclasses.dataclass(frozen=True)
class RankHalo:
    """One rank's part of a :class:`HaloPlan` (host ints; ``h = Wc - 1``; the halo *slot*
    ``i * h + j`` is row ``j`` of local fragment ``i``'s halo).

    Fields:
        rank, num_fragments: the rank and its fragment count.
        has_halo: whether any local fragment has a predecessor (the local call then takes
            an ``initial_state`` of ``num_fragments * h`` slots, zero where unused).
        send_rows: local token rows packed, in order, into the forward send buffer.
        fill_self: ``(slot, local row)``: halo rows copied from this rank's own tokens.
        fill_recv: ``(slot, gathered row)``: halo rows read from the gathered buffer.
        publish: the halo slots whose gradients this rank packs, in order, into the
            backward send buffer (the rows other ranks gave it).
        touched: sorted local rows that receive halo gradients.
        rounds: per round, ``(index into touched, pool row)`` pairs, each row at most once
            per round; round ``k`` adds each row's ``k``-th contribution in document
            order. The pool is ``[slot gradients (n_slots rows); gathered backward rows]``.
        n_slots: ``num_fragments * h`` when ``has_halo``, else 0.
    """

    rank: int
    num_fragments: int
    has_halo: bool
    send_rows: tuple[int, ...]
    fill_self: tuple[tuple[int, int], ...]
    fill_recv: tuple[tuple[int, int], ...]
    publish: tuple[int, ...]
    touched: tuple[int, ...]
    rounds: tuple[tuple[tuple[int, int], ...], ...]
    n_slots: int


@dataclasses.dataclass(frozen=True)
class HaloPlan:
    """The halo exchange of a partition for kernel size ``kernel_size`` (global: equal on
    every rank). ``fwd_rows_per_rank`` (``S_f``) / ``bwd_rows_per_rank`` (``S_b``): rows of
    every rank's forward / backward send buffer (the maximum over ranks; 0: no halo row
    crosses a rank, no collective for the halo). ``ranks[r]``: rank ``r``'s
    :class:`RankHalo`."""

    kernel_size: int
    world_size: int
    fwd_rows_per_rank: int
    bwd_rows_per_rank: int
    ranks: tuple[RankHalo, ...]


def halo_tables(partition: Partition, kernel_size: int
                ) -> tuple[tuple[tuple[HaloEntry, ...], ...], tuple[tuple[HaloSend, ...], ...]]:
    """Every rank's halo entries and halo sends for width ``kernel_size``, in one pass:
    ``(halos, sends)`` with ``halos[r] == build_context(partition, .., r, ..,
    kernel_size).halo`` and ``sends[r] == ....halo_send`` (the same
    :class:`cake_core.kcp.HaloEntry` / :class:`~cake_core.kcp.HaloSend` objects and orders;
    a test checks it), without building ``W`` contexts. Walks back from each continuing
    fragment through its document's chain only as far as its ``kernel_size - 1`` rows
    reach."""
    h = kernel_size - 1
    W = partition.world_size
    halos: list[list[HaloEntry]] = [[] for _ in range(W)]
    sends: list[list[HaloSend]] = [[] for _ in range(W)]
    for dst, frags in enumerate(partition.table):
        for di, f in enumerate(frags):
            if not f.has_prev:
                continue
            n = min(h, f.doc_offset)
            lo = f.doc_offset - n
            pieces = []
            for sr, si in reversed(partition.doc_chain(f.doc)[:f.chain_pos]):
                g = partition.table[sr][si]
                end = g.doc_offset + g.length
                if end <= lo:
                    break
                a = max(lo, g.doc_offset)
                pieces.append(HaloPiece(sr, si, g.local_offset + a - g.doc_offset, end - a,
                                        (h - n) + a - lo))
            pieces.reverse()  # document order
            halos[dst].append(HaloEntry(di, n, tuple(pieces)))
            for p in pieces:
                if p.src_rank != dst:
                    sends[p.src_rank].append(HaloSend(dst, di, p.src_fragment,
                                                      p.src_local_offset, p.count,
                                                      p.halo_offset))
    return tuple(tuple(x) for x in halos), tuple(tuple(x) for x in sends)


@functools.lru_cache(maxsize=32)
def halo_plan(partition: Partition, kernel_size: int) -> HaloPlan:
    """The :class:`HaloPlan` of ``partition`` for a convolution of width ``kernel_size``
    (host data only, from :func:`halo_tables`; cached per partition and width)."""
    W, h = partition.world_size, kernel_size - 1
    halos, sends = halo_tables(partition, kernel_size)
    # forward: the rows each rank gives others, in its halo_send order
    fwd_at: dict[tuple[int, int, int], tuple[int, int]] = {}
    send_rows: list[tuple[int, ...]] = []
    for r in range(W):
        rows: list[int] = []
        for s in sends[r]:
            fwd_at[(s.dst_rank, s.dst_fragment, s.halo_offset)] = (r, len(rows))
            rows.extend(range(s.src_local_offset, s.src_local_offset + s.count))
        send_rows.append(tuple(rows))
    s_f = max((len(x) for x in send_rows), default=0)
    # backward: the gradients of the rows each rank got from others, in its halo order
    bwd_at: dict[tuple[int, int, int], int] = {}
    publish: list[tuple[int, ...]] = []
    for r in range(W):
        slots: list[int] = []
        for e in halos[r]:
            for p in e.pieces:
                if p.src_rank != r:
                    bwd_at[(r, e.fragment, p.halo_offset)] = len(slots)
                    slots.extend(e.fragment * h + p.halo_offset + j for j in range(p.count))
        publish.append(tuple(slots))
    s_b = max((len(x) for x in publish), default=0)

    ranks = []
    for r in range(W):
        frags = partition.table[r]
        has_halo = bool(halos[r])
        n_slots = len(frags) * h if has_halo else 0
        fill_self, fill_recv = [], []
        contrib: dict[int, list[tuple[int, int]]] = {}  # local row -> [(key, pool row)]
        for e in halos[r]:
            key = frags[e.fragment].global_offset
            for p in e.pieces:
                for j in range(p.count):
                    slot = e.fragment * h + p.halo_offset + j
                    if p.src_rank == r:
                        row = p.src_local_offset + j
                        fill_self.append((slot, row))
                        contrib.setdefault(row, []).append((key, slot))
                    else:
                        src, off = fwd_at[(r, e.fragment, p.halo_offset)]
                        fill_recv.append((slot, src * s_f + off + j))
        for s in sends[r]:
            key = partition.table[s.dst_rank][s.dst_fragment].global_offset
            base = n_slots + s.dst_rank * s_b + bwd_at[(s.dst_rank, s.dst_fragment,
                                                        s.halo_offset)]
            for j in range(s.count):
                contrib.setdefault(s.src_local_offset + j, []).append((key, base + j))
        touched = tuple(sorted(contrib))
        rounds: list[list[tuple[int, int]]] = []
        for i, row in enumerate(touched):
            for k, (_, pool) in enumerate(sorted(contrib[row])):
                if k == len(rounds):
                    rounds.append([])
                rounds[k].append((i, pool))
        ranks.append(RankHalo(r, len(frags), has_halo, send_rows[r], tuple(fill_self),
                              tuple(fill_recv), publish[r], touched,
                              tuple(tuple(x) for x in rounds), n_slots))
    return HaloPlan(kernel_size, W, s_f, s_b, tuple(ranks))


@dataclasses.dataclass(frozen=True)
class DeviceHalo:
    """A :class:`RankHalo` as int64 index tensors on the context's device (cached per
    context): ``send_rows``, ``self_dst`` / ``self_src``, ``recv_dst`` / ``recv_src``,
    ``publish``, ``touched`` and ``rounds`` (``(positions, pool rows)`` per round)."""

    plan: HaloPlan
    rank: RankHalo
    send_rows: torch.Tensor
    self_dst: torch.Tensor
    self_src: torch.Tensor
    recv_dst: torch.Tensor
    recv_src: torch.Tensor
    publish: torch.Tensor
    touched: torch.Tensor
    rounds: tuple[tuple[torch.Tensor, torch.Tensor], ...]


_DEVICE_HALO: weakref.WeakKeyDictionary[Context, DeviceHalo] = weakref.WeakKeyDictionary()


def device_halo(ctx: Context) -> DeviceHalo:
    """This rank's halo plan (for ``ctx.conv_kernel_size``) as index tensors on
    ``ctx.device``; cached per context."""
    got = _DEVICE_HALO.get(ctx)
    if got is not None:
        return got
    plan = halo_plan(ctx.partition, ctx.conv_kernel_size)
    rh = plan.ranks[ctx.rank]

    def ix(values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64).to(ctx.device)

    got = DeviceHalo(
        plan, rh, ix(rh.send_rows), ix(s for s, _ in rh.fill_self),
        ix(r for _, r in rh.fill_self), ix(s for s, _ in rh.fill_recv),
        ix(r for _, r in rh.fill_recv), ix(rh.publish), ix(rh.touched),
        tuple((ix(i for i, _ in rnd), ix(p for _, p in rnd)) for rnd in rh.rounds))
    _DEVICE_HALO[ctx] = got
    return got


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def fwd_payload_bytes(plan: HaloPlan, channels: int, itemsize: int) -> int:
    """Bytes of one rank's forward all-gather row (0: no collective)."""
    if plan.world_size == 1:
        return 0
    return plan.fwd_rows_per_rank * channels * itemsize


def bwd_payload_bytes(plan: HaloPlan, channels: int, itemsize: int, n_weight: int) -> int:
    """Bytes of one rank's backward all-gather row: ``n_weight`` fp32 weight-gradient
    values (0 without ``reduce_weight_grads``), then ``S_b`` halo-gradient rows, padded to
    a multiple of 8 (0: no collective)."""
    if plan.world_size == 1:
        return 0
    return _pad8(4 * n_weight + plan.bwd_rows_per_rank * channels * itemsize)


def comm_bytes(ctx: Context, channels: int, dtype: torch.dtype = torch.float32, *,
                   bias: bool = False, reduce_weight_grads: bool = False) -> dict[str, int]:
    """Bytes this package's collectives send and receive on ``ctx``'s rank per training
    step of one layer (forward + backward), for
    ``channels`` (D) channels of ``dtype`` inputs and a kernel of ``ctx.conv_kernel_size``.

    Forward: one all-gather of ``S_f * D * b`` bytes per rank (padding rows included; none when
    no halo row crosses a rank). Backward: one all-gather of ``4 * (D * Wc [+ D])`` bytes of
    fp32 weight-gradient shares when ``reduce_weight_grads`` (``+ D`` with a bias), then
    ``S_b * D * b`` bytes of halo gradients, padded to 8 bytes; none when both are empty or
    ``W = 1``. Keys: ``fwd_sent``, ``fwd_received`` (``(W - 1)`` times sent), ``bwd_sent``,
    ``bwd_received``, ``calls`` (collectives, both directions), ``halo_rows_out`` /
    ``halo_rows_in`` (this rank's real halo rows sent to / received from other ranks, without
    padding). Steady state: the first call of each entry on a context (the forward's and the
    backward's) adds one all-gather of 16 bytes per rank, the ranks' agreement
    (:func:`cake_core.kcp.agree_once`), not counted here.

    Example: ``comm_bytes(ctx, 4096, torch.bfloat16)["fwd_sent"]``.
    """
    plan = halo_plan(ctx.partition, ctx.conv_kernel_size)
    b = torch.empty((), dtype=dtype).element_size()
    D = int(channels)
    nw = (D * ctx.conv_kernel_size + (D if bias else 0)) if reduce_weight_grads else 0
    f = fwd_payload_bytes(plan, D, b)
    g = bwd_payload_bytes(plan, D, b, nw)
    w = ctx.world_size
    rh = plan.ranks[ctx.rank]
    return {"fwd_sent": f, "fwd_received": (w - 1) * f, "bwd_sent": g,
            "bwd_received": (w - 1) * g, "calls": int(f > 0) + int(g > 0),
            "halo_rows_out": len(rh.send_rows), "halo_rows_in": len(rh.fill_recv)}
