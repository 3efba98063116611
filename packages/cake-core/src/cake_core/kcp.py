"""Context-parallel (KCP) metadata shared by every ``-kcp`` family: partitions and contexts.

Context parallelism splits one packed batch of documents (global ``cu_seqlens`` over ``T``
tokens) over the ``W`` ranks of a process group. A delta-rule layer (GDN, KDA) cannot start
a rank's tokens until it knows the recurrent state left by the same document's tokens on
other ranks, and a causal convolution needs the ``conv_kernel_size - 1`` tokens just before
each rank's piece of a document. This module holds the host-side bookkeeping for both, in
plain Python and torch (it imports neither Triton nor any kernel):

* :class:`Partition`: which global tokens each rank holds, cut into :class:`Fragment`
  objects (the maximal runs of one document that are contiguous on one rank). Pure
  metadata: frozen, hashable, serialisable, equal on every rank, reusable by every layer.
* :class:`Context` (made by :func:`build_context`): one rank's view of a partition on one
  device and process group: its local ``cu_seqlens``, which fragments receive a state and
  which send one, the exchange plan of both strategies (:class:`AllGatherPlan`,
  :class:`RingPlan`), the causal-convolution halo plan and byte counts.

The design follows FLA's context-parallel GDN (``fla.ops.cp``: ``build_cp_context`` and its
``FLACPContext``, which carry the rank-local ``cu_seqlens``, how many earlier / later ranks
share the first / last local sequence, the conv halo length and, for the zigzag layout,
the same per part; every rank all-gathers one ``[HV, K, V + K]`` fp32 affine summary per
part and merges the chain). cake generalises it: the token count need not divide by
``W`` (or ``2W``), a rank may hold any number of crossing fragments (explicit tables),
ranks may hold no tokens, and the merge order is spelled out here so that every rank
folds the same summaries in the same order. See ``docs/kcp.md`` for the algorithm, the
message sizes and what the det promise covers across partitions.

Conventions. Ranks are group ranks ``0 .. W-1``. "Global" positions index the packed batch
of ``T`` tokens; "local" positions index one rank's own token array (its tokens in local
order, e.g. part ``r`` then part ``2W-1-r`` for zigzag). A fragment's *chain position* is its
index in its document's chain (the document's fragments in global token order). Every
error raised here is a ``ValueError`` whose message starts with the argument's name.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "LAYOUTS",
    "EXCHANGES",
    "AllGatherPlan",
    "Context",
    "ExchangeBytes",
    "Fragment",
    "GatherSlot",
    "HaloEntry",
    "HaloPiece",
    "HaloSend",
    "Handoff",
    "Partition",
    "RecvEntry",
    "RingPlan",
    "SendEntry",
    "agree_once",
    "build_context",
    "build_context_det_kcp",
    "check_context",
    "has_middle_fragments",
    "partition_det_kcp",
]

#: Layouts :meth:`Partition.from_cu_seqlens` knows.
LAYOUTS = ("contiguous", "zigzag", "zigzag_per_document")
#: Exchange strategies :func:`build_context` knows.
EXCHANGES = ("allgather", "ring")

_FORMAT_VERSION = 1
_KIND = "cake_core.kcp.Partition"


# --------------------------------------------------------------------------- validation


def _as_int(v: object, name: str) -> int:
    """``v`` as a Python int; bools, floats and other non-integers raise ``ValueError``."""
    if isinstance(v, bool):
        raise ValueError(f"{name}: expected an integer, got bool {v!r}")
    if isinstance(v, torch.Tensor):
        if v.dim() != 0 or v.dtype.is_floating_point or v.dtype.is_complex or \
                v.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer, got a tensor {v!r}")
        return int(v.item())
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{name}: expected an integer, got {type(v).__name__} {v!r}") from None


def _check_world_size(world_size: object) -> int:
    w = _as_int(world_size, "world_size")
    if w < 1:
        raise ValueError(f"world_size: must be >= 1, got {w}")
    return w


def _cu_list(cu_seqlens: object, name: str = "cu_seqlens") -> list[int]:
    """Validated global offsets as a list of ints: 1-D, >= 2 entries, starts at 0,
    non-decreasing. A tensor must be int32/int64 on the CPU."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError(f"{name}: must be a CPU tensor (host metadata), got one on "
                             f"{cu_seqlens.device}")
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: expected dtype in (torch.int32, torch.int64), got "
                             f"{cu_seqlens.dtype}")
        if cu_seqlens.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape "
                             f"{tuple(cu_seqlens.shape)}")
        values = [int(x) for x in cu_seqlens.tolist()]
    elif isinstance(cu_seqlens, (list, tuple)):
        values = [_as_int(x, f"{name}[{i}]") for i, x in enumerate(cu_seqlens)]
    else:
        raise ValueError(f"{name}: expected a CPU int tensor or a list of ints, got "
                         f"{type(cu_seqlens).__name__}")
    if len(values) < 2:
        raise ValueError(f"{name}: expected at least 2 entries (one document), got "
                         f"{len(values)}")
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name}: must be non-decreasing, but entry {i} ({values[i]}) < "
                             f"entry {i - 1} ({values[i - 1]})")
    return values


def _check_rank(rank: object, world_size: int, name: str = "rank") -> int:
    r = _as_int(rank, name)
    if not 0 <= r < world_size:
        raise ValueError(f"{name}: must be in [0, {world_size}), got {r}")
    return r


# --------------------------------------------------------------------------- fragments


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A maximal run of one document's tokens held contiguously by one rank.

    Fields (all ints, or ``None`` where said):
        rank: the rank holding it.
        doc: the document (index into the global ``cu_seqlens``).
        doc_offset: offset of its first token inside the document.
        length: its token count (always >= 1: zero-length fragments are dropped).
        local_offset: offset of its first token in the rank's local token array.
        global_offset: offset of its first token in the global packed batch
            (``cu_seqlens[doc] + doc_offset``).
        chain_pos: its index in the document's chain (see :meth:`Partition.doc_chain`).
        prev_rank: the rank holding the document's token just before this fragment, or
            ``None`` when the fragment starts the document (``doc_offset == 0``).
        next_rank: the rank holding the document's token just after it, or ``None`` when
            the fragment ends the document.
    """

    rank: int
    doc: int
    doc_offset: int
    length: int
    local_offset: int
    global_offset: int
    chain_pos: int
    prev_rank: int | None
    next_rank: int | None

    @property
    def has_prev(self) -> bool:
        """Whether an earlier fragment of the document exists (an incoming state)."""
        return self.prev_rank is not None

    @property
    def has_next(self) -> bool:
        """Whether a later fragment of the document exists (the end state is needed)."""
        return self.next_rank is not None


def _normalise(pieces: list[list[tuple[int, int, int]]]) -> list[list[tuple[int, int, int]]]:
    """Drop zero-length pieces, then merge a rank's consecutive pieces that continue each
    other in the same document (contiguous locally and in the document)."""
    out = []
    for rank_pieces in pieces:
        merged: list[tuple[int, int, int]] = []
        for doc, off, n in rank_pieces:
            if n == 0:
                continue
            if merged and merged[-1][0] == doc and merged[-1][1] + merged[-1][2] == off:
                merged[-1] = (doc, merged[-1][1], merged[-1][2] + n)
            else:
                merged.append((doc, off, n))
        out.append(merged)
    return out


def _assemble(cu: list[int], world_size: int, pieces: list[list[tuple[int, int, int]]],
              name: str) -> tuple[tuple[Fragment, ...], ...]:
    """Per-rank fragment tuples from per-rank ``(doc, doc_offset, length)`` pieces in local
    order: normalise, check that the pieces tile every document exactly once, link chains."""
    pieces = _normalise(pieces)
    num_docs = len(cu) - 1
    by_doc: list[list[tuple[int, int, int, int]]] = [[] for _ in range(num_docs)]
    for r, rank_pieces in enumerate(pieces):
        for i, (doc, off, n) in enumerate(rank_pieces):
            by_doc[doc].append((off, n, r, i))
    chain_of: dict[tuple[int, int], tuple[int, int, int]] = {}  # (r, i) -> (pos, prev, next)
    for doc, items in enumerate(by_doc):
        items.sort()
        doc_len = cu[doc + 1] - cu[doc]
        expected = 0
        for off, n, r, _ in items:
            if off < expected:
                raise ValueError(
                    f"{name}: fragments overlap: document {doc} tokens "
                    f"[{off}, {min(expected, off + n)}) are held twice (again by rank {r})")
            if off > expected:
                raise ValueError(
                    f"{name}: fragments do not cover document {doc} tokens [{expected}, {off}) "
                    f"(global [{cu[doc] + expected}, {cu[doc] + off}))")
            expected = off + n
        if expected > doc_len:
            raise ValueError(f"{name}: a fragment of document {doc} ends at offset {expected}, "
                             f"past the document's length {doc_len}")
        if expected < doc_len:
            raise ValueError(
                f"{name}: fragments do not cover document {doc} tokens [{expected}, {doc_len}) "
                f"(global [{cu[doc] + expected}, {cu[doc + 1]}))")
        for pos, (_, _, r, i) in enumerate(items):
            prev = items[pos - 1][2] if pos > 0 else None
            nxt = items[pos + 1][2] if pos + 1 < len(items) else None
            chain_of[(r, i)] = (pos, prev, nxt)
    table = []
    for r, rank_pieces in enumerate(pieces):
        frags = []
        local = 0
        for i, (doc, off, n) in enumerate(rank_pieces):
            pos, prev, nxt = chain_of[(r, i)]
            frags.append(Fragment(rank=r, doc=doc, doc_offset=off, length=n, local_offset=local,
                                  global_offset=cu[doc] + off, chain_pos=pos, prev_rank=prev,
                                  next_rank=nxt))
            local += n
        table.append(tuple(frags))
    assert len(table) == world_size
    return tuple(table)


def _split_range(cu: list[int], start: int, length: int) -> list[tuple[int, int, int]]:
    """Global token range ``[start, start + length)`` cut at document boundaries into
    ``(doc, doc_offset, length)`` pieces (empty documents yield none)."""
    out = []
    pos, end = start, start + length
    while pos < end:
        doc = bisect.bisect_right(cu, pos) - 1
        stop = min(end, cu[doc + 1])
        out.append((doc, pos - cu[doc], stop - pos))
        pos = stop
    return out


# --------------------------------------------------------------------------- partition


@dataclasses.dataclass(frozen=True)
class Partition:
    """Which global tokens each rank of a context-parallel group holds, as fragments.

    Build it with :meth:`from_cu_seqlens` (a layout), :meth:`from_ranges` (per-rank global
    token ranges) or :meth:`from_fragments` (an explicit fragment table); not with the
    constructor. It reads host data only, is frozen and hashable (``hash()`` derives from
    ``key``, so it is the same in every process), and two partitions are equal exactly when
    they give every rank the same fragments of the same documents: built on every rank from
    the same inputs they are equal everywhere. ``key`` is a sha256-based digest for
    comparing partitions across processes; :meth:`to_dict` / :meth:`from_dict` serialise.

    Normal form (every constructor): zero-length fragments are dropped (empty documents
    and empty ranks have no fragments; a rank may hold none at all), and a rank's
    consecutive pieces of one document that continue each other (adjacent both in its
    local order and in the document) are merged into one fragment. So a fragment always
    has ``length >= 1``, a document's consecutive fragments are never adjacent on the same
    rank, and e.g. zigzag with ``W = 1`` equals contiguous with ``W = 1``.

    Fields:
        world_size: ``W >= 1``.
        total_tokens: ``T = cu_seqlens[-1] >= 0``.
        cu_seqlens: the global document offsets, a tuple of ``num_docs + 1`` ints.
        table: per rank, its fragments in local order (``table[r] == fragments(r)``).
        layout: ``"contiguous"``, ``"zigzag"``, ``"ranges"`` or ``"explicit"``: how it was
            built. A label only: not compared, hashed or digested.
    """

    world_size: int
    total_tokens: int
    cu_seqlens: tuple[int, ...]
    table: tuple[tuple[Fragment, ...], ...]
    layout: str = dataclasses.field(default="explicit", compare=False)
    _chains: tuple[tuple[tuple[int, int], ...], ...] = dataclasses.field(
        default=(), compare=False, repr=False, init=False)
    _key: str = dataclasses.field(default="", compare=False, repr=False, init=False)

    def __post_init__(self) -> None:
        chains: list[list[tuple[int, int, int]]] = [[] for _ in range(self.num_docs)]
        for r, frags in enumerate(self.table):
            for i, f in enumerate(frags):
                chains[f.doc].append((f.chain_pos, r, i))
        object.__setattr__(self, "_chains", tuple(
            tuple((r, i) for _, r, i in sorted(c)) for c in chains))
        d = self.to_dict()
        del d["layout"]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        object.__setattr__(self, "_key", "Partition:" + hashlib.sha256(blob).hexdigest()[:16])

    def __hash__(self) -> int:
        # from the sha256 key, not from hash() of the fields: the same in every process
        return int(self._key[-16:], 16)

    # ---- constructors ----

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens_global_cpu: torch.Tensor | Sequence[int],
                        world_size: int, layout: str = "contiguous") -> Partition:
        """Partition a packed batch by a layout.

        Args:
            cu_seqlens_global_cpu: the global offsets ``[N + 1]`` (N >= 1 documents, empty
                ones allowed): an int32/int64 CPU tensor or a sequence of ints, starting at
                0, non-decreasing; ``T = cu_seqlens[-1]``.
            world_size: ``W >= 1``.
            layout: ``"contiguous"``: rank ``r`` holds the global tokens
                ``[floor(r*T/W), floor((r+1)*T/W))``. ``"zigzag"``: the ``T`` tokens are cut
                into ``2W`` parts the same way (part ``p`` is
                ``[floor(p*T/(2W)), floor((p+1)*T/(2W)))``) and rank ``r`` holds part ``r``
                followed by part ``2W-1-r`` (its local tokens in that order), which
                balances causal work. ``T`` need not divide by ``W``; cuts need not fall on
                chunk or document boundaries; with ``T < W`` (or ``< 2W``) some ranks or
                parts are empty. ``"zigzag_per_document"``: every document (length ``L``)
                is cut into ``2W`` parts the same way (part ``p`` is its tokens
                ``[floor(p*L/(2W)), floor((p+1)*L/(2W)))``) and rank ``r`` holds, document
                after document, part ``r`` then part ``2W-1-r``: a document of at least
                ``2W`` tokens crosses every rank and gives each the same causal work (its
                state is exchanged); shorter documents' parts are uneven (the rounding
                leaves their tokens on the same ranks: a 1-token document is rank 0's).

        Raises:
            ValueError: bad ``cu_seqlens`` (not a CPU int32/int64 tensor or int sequence,
                not 1-D, fewer than 2 entries, not starting at 0, decreasing, non-integer
                entries), ``world_size < 1`` or not an int, unknown layout.
        """
        cu = _cu_list(cu_seqlens_global_cpu, "cu_seqlens_global_cpu")
        w = _check_world_size(world_size)
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        t = cu[-1]
        if layout == "contiguous":
            ranges = [[(r * t // w, (r + 1) * t // w - r * t // w)] for r in range(w)]
        elif layout == "zigzag_per_document":
            parts = 2 * w
            ranges = [[] for _ in range(w)]
            for a, b in zip(cu[:-1], cu[1:], strict=True):
                cut = [a + p * (b - a) // parts for p in range(parts + 1)]
                for r in range(w):
                    ranges[r] += [(cut[p], cut[p + 1] - cut[p]) for p in (r, parts - 1 - r)]
        else:
            parts = 2 * w
            cut = [p * t // parts for p in range(parts + 1)]
            ranges = [[(cut[p], cut[p + 1] - cut[p]) for p in (r, parts - 1 - r)]
                      for r in range(w)]
        pieces = [[pc for s, n in rr for pc in _split_range(cu, s, n)] for rr in ranges]
        return cls(world_size=w, total_tokens=t, cu_seqlens=tuple(cu),
                   table=_assemble(cu, w, pieces, "cu_seqlens_global_cpu"), layout=layout)

    @classmethod
    def from_ranges(cls, cu_seqlens_global_cpu: torch.Tensor | Sequence[int],
                    world_size: int,
                    ranges: Sequence[Sequence[tuple[int, int]]]) -> Partition:
        """Partition by explicit global token ranges per rank.

        Args:
            cu_seqlens_global_cpu: as in :meth:`from_cu_seqlens`.
            world_size: ``W >= 1``.
            ranges: ``W`` sequences; ``ranges[r]`` lists rank ``r``'s ``(global_start,
                length)`` token ranges in its local order (its local tokens are these
                ranges concatenated). Ranges are cut at document boundaries into
                fragments. Together they must cover ``[0, T)`` exactly once.

        Raises:
            ValueError: as :meth:`from_cu_seqlens`, plus ``ranges`` of the wrong length,
                malformed entries, ranges outside ``[0, T)``, overlaps or gaps.
        """
        cu = _cu_list(cu_seqlens_global_cpu, "cu_seqlens_global_cpu")
        w = _check_world_size(world_size)
        t = cu[-1]
        if not isinstance(ranges, Sequence) or len(ranges) != w:
            raise ValueError(f"ranges: expected a sequence of world_size = {w} per-rank "
                             f"sequences, got {ranges!r}")
        pieces = []
        for r, rr in enumerate(ranges):
            rank_pieces = []
            for j, item in enumerate(rr):
                nm = f"ranges[{r}][{j}]"
                if not isinstance(item, Sequence) or len(item) != 2:
                    raise ValueError(f"{nm}: expected (global_start, length), got {item!r}")
                s, n = _as_int(item[0], nm), _as_int(item[1], nm)
                if s < 0 or n < 0 or s + n > t:
                    raise ValueError(f"{nm}: range [{s}, {s + n}) is not inside [0, {t})")
                rank_pieces.extend(_split_range(cu, s, n))
            pieces.append(rank_pieces)
        return cls(world_size=w, total_tokens=t, cu_seqlens=tuple(cu),
                   table=_assemble(cu, w, pieces, "ranges"), layout="ranges")

    @classmethod
    def from_fragments(cls, table: Sequence[object], world_size: int, total_tokens: int, *,
                       cu_seqlens: torch.Tensor | Sequence[int] | None = None) -> Partition:
        """Partition by an explicit fragment table.

        Args:
            table: rows, one per fragment: ``(rank, doc, doc_offset, length)`` sequences,
                mappings with those keys, or :class:`Fragment` objects (only those four
                fields are read). A rank's rows, in table order, are its local order; rows
                of different ranks may interleave. Zero-length rows are dropped (they may
                serve to declare an empty document); continuing rows are merged (see the
                class docstring).
            world_size: ``W >= 1``; every row's rank is in ``[0, W)``.
            total_tokens: ``T``; the rows must cover ``T`` tokens in all.
            cu_seqlens: the global offsets, when known (the families pass them): the rows
                must tile each document ``[0, cu[d+1] - cu[d])`` exactly once, and
                ``cu[-1] == total_tokens``. Without it, documents are ``0 .. max doc`` in
                global order, each as long as the largest ``doc_offset + length`` of its
                rows (documents with no rows are empty).

        Raises:
            ValueError: malformed rows, ranks or documents out of range, negative offsets or
                lengths, fragments that overlap or leave a gap in a document, a total other
                than ``total_tokens``, bad ``cu_seqlens``, ``world_size < 1``.
        """
        w = _check_world_size(world_size)
        t = _as_int(total_tokens, "total_tokens")
        if t < 0:
            raise ValueError(f"total_tokens: must be >= 0, got {t}")
        if not isinstance(table, Sequence) or isinstance(table, (str, bytes)):
            raise ValueError(f"table: expected a sequence of rows, got {type(table).__name__}")
        rows = []
        for j, row in enumerate(table):
            nm = f"table[{j}]"
            if isinstance(row, Fragment):
                vals = (row.rank, row.doc, row.doc_offset, row.length)
            elif isinstance(row, Mapping):
                try:
                    vals = tuple(row[k] for k in ("rank", "doc", "doc_offset", "length"))
                except KeyError as e:
                    raise ValueError(f"{nm}: missing key {e.args[0]!r}") from None
            elif isinstance(row, Sequence) and not isinstance(row, (str, bytes)) \
                    and len(row) == 4:
                vals = tuple(row)
            else:
                raise ValueError(f"{nm}: expected (rank, doc, doc_offset, length), got {row!r}")
            r, d, off, n = (_as_int(v, nm) for v in vals)
            if not 0 <= r < w:
                raise ValueError(f"{nm}: rank {r} is not in [0, {w})")
            if d < 0 or off < 0 or n < 0:
                raise ValueError(f"{nm}: doc, doc_offset and length must be >= 0, got "
                                 f"{(d, off, n)}")
            rows.append((r, d, off, n))
        if cu_seqlens is not None:
            cu = _cu_list(cu_seqlens, "cu_seqlens")
            if cu[-1] != t:
                raise ValueError(f"cu_seqlens: ends at {cu[-1]}, but total_tokens is {t}")
            for j, (_, d, _, _) in enumerate(rows):
                if d >= len(cu) - 1:
                    raise ValueError(f"table[{j}]: doc {d} is not in [0, {len(cu) - 1})")
        else:
            num_docs = max((d for _, d, _, _ in rows), default=-1) + 1
            if num_docs == 0:
                num_docs = 1  # no rows at all: one empty document
            lengths = [0] * num_docs
            for _, d, off, n in rows:
                lengths[d] = max(lengths[d], off + n)
            cu = [0]
            for n in lengths:
                cu.append(cu[-1] + n)
            if cu[-1] != t:
                raise ValueError(f"table: the fragments' documents span {cu[-1]} tokens, but "
                                 f"total_tokens is {t}")
        pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(w)]
        for r, d, off, n in rows:
            pieces[r].append((d, off, n))
        return cls(world_size=w, total_tokens=t, cu_seqlens=tuple(cu),
                   table=_assemble(cu, w, pieces, "table"), layout="explicit")

    # ---- serialisation ----

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: ``kind``, ``format_version``, ``world_size``,
        ``total_tokens``, ``cu_seqlens`` (list), ``layout`` and ``fragments``: rows
        ``[rank, doc, doc_offset, length]`` in rank, then local order."""
        return {
            "kind": _KIND,
            "format_version": _FORMAT_VERSION,
            "world_size": self.world_size,
            "total_tokens": self.total_tokens,
            "cu_seqlens": list(self.cu_seqlens),
            "layout": self.layout,
            "fragments": [[f.rank, f.doc, f.doc_offset, f.length]
                          for frags in self.table for f in frags],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Partition:
        """Inverse of :meth:`to_dict` (validates everything again).

        Raises:
            ValueError: another ``kind`` or ``format_version``, missing keys, or any error
                of :meth:`from_fragments`.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"d: expected a mapping, got {type(d).__name__}")
        if d.get("kind") != _KIND:
            raise ValueError(f"d: kind is {d.get('kind')!r}, expected {_KIND!r}")
        if d.get("format_version") != _FORMAT_VERSION:
            raise ValueError(f"d: format_version is {d.get('format_version')!r}, expected "
                             f"{_FORMAT_VERSION}")
        try:
            p = cls.from_fragments(d["fragments"], d["world_size"], d["total_tokens"],
                                   cu_seqlens=d["cu_seqlens"])
        except KeyError as e:
            raise ValueError(f"d: missing key {e.args[0]!r}") from None
        layout = d.get("layout", "explicit")
        if not isinstance(layout, str):
            raise ValueError(f"d: layout must be a str, got {layout!r}")
        return dataclasses.replace(p, layout=layout)

    def to_json(self) -> str:
        """:meth:`to_dict` as canonical JSON (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """``"Partition:<16 hex>"``: sha256 of the canonical JSON without the layout label;
        equal partitions have equal keys in every process and on every machine."""
        return self._key

    # ---- queries ----

    @property
    def num_docs(self) -> int:
        """``N = len(cu_seqlens) - 1`` (empty documents included)."""
        return len(self.cu_seqlens) - 1

    def cu_seqlens_cpu(self) -> torch.Tensor:
        """The global offsets as a new int64 CPU tensor ``[N + 1]``."""
        return torch.tensor(self.cu_seqlens, dtype=torch.int64)

    def fragments(self, rank: int) -> tuple[Fragment, ...]:
        """Rank ``rank``'s fragments in local order (their ``local_offset`` increasing,
        tiling ``[0, local_num_tokens(rank))``); empty for a rank without tokens."""
        return self.table[_check_rank(rank, self.world_size)]

    def local_num_tokens(self, rank: int) -> int:
        """How many tokens rank ``rank`` holds (may be 0)."""
        return sum(f.length for f in self.fragments(rank))

    def local_cu_seqlens(self, rank: int) -> torch.Tensor:
        """A new int64 CPU tensor ``[n_frag + 1]``: the offsets of rank ``rank``'s fragments
        in its local tokens, ``[0, len_0, len_0 + len_1, ...]``. Each fragment is a separate
        sequence for the local (single-rank) kernels. A rank without tokens gets ``[0]``
        (no sequence: its local kernels must be skipped, not launched)."""
        frags = self.fragments(rank)
        return torch.tensor([0] + [f.local_offset + f.length for f in frags], dtype=torch.int64)

    def global_index(self, rank: int) -> torch.Tensor:
        """A new int64 CPU tensor ``[local_num_tokens(rank)]``: the global position of each of
        rank ``rank``'s local tokens (shard a global tensor with ``x[:, idx]``)."""
        frags = self.fragments(rank)
        if not frags:
            return torch.zeros(0, dtype=torch.int64)
        return torch.cat([torch.arange(f.global_offset, f.global_offset + f.length,
                                       dtype=torch.int64) for f in frags])

    def doc_chain(self, doc: int) -> tuple[tuple[int, int], ...]:
        """Document ``doc``'s fragments as ``(rank, fragment index)`` pairs in global token
        order (chain position 0 first). ``fragment index`` indexes ``fragments(rank)``. The
        ranks need not increase (zigzag: a long document visits ranks ``0, 1, ..., W-1`` then
        ``W-1, ..., 0``); an empty document has an empty chain."""
        d = _as_int(doc, "doc")
        if not 0 <= d < self.num_docs:
            raise ValueError(f"doc: must be in [0, {self.num_docs}), got {d}")
        return self._chains[d]

    def fragment(self, rank: int, index: int) -> Fragment:
        """``fragments(rank)[index]`` with a ``ValueError`` for a bad index."""
        frags = self.fragments(rank)
        i = _as_int(index, "index")
        if not 0 <= i < len(frags):
            raise ValueError(f"index: rank {rank} holds {len(frags)} fragments, got {i}")
        return frags[i]

    def allgather_plan(self) -> AllGatherPlan:
        """The all-gather exchange plan (:class:`AllGatherPlan`); same on every rank."""
        fwd: list[GatherSlot] = []
        bwd: list[GatherSlot] = []
        for r, frags in enumerate(self.table):
            continuing = [(i, f) for i, f in enumerate(frags) if f.has_next]
            continued = [(i, f) for i, f in enumerate(frags) if f.has_prev]
            fwd.extend(GatherSlot(r, k, i, f.doc, f.chain_pos)
                       for k, (i, f) in enumerate(continuing))
            bwd.extend(GatherSlot(r, k, i, f.doc, f.chain_pos)
                       for k, (i, f) in enumerate(continued))
        per_fwd = max((s.slot + 1 for s in fwd), default=0)
        per_bwd = max((s.slot + 1 for s in bwd), default=0)
        return AllGatherPlan(self.world_size, per_fwd, tuple(fwd), per_bwd, tuple(bwd))

    def ring_plan(self) -> RingPlan:
        """The ring exchange plan (:class:`RingPlan`); same on every rank."""
        hand = []
        for doc, chain in enumerate(self._chains):
            for pos in range(len(chain) - 1):
                (sr, si), (dr, di) = chain[pos], chain[pos + 1]
                hand.append(Handoff(pos, doc, sr, si, dr, di))
        hand.sort(key=lambda h: (h.step, h.doc))
        steps = max((h.step + 1 for h in hand), default=0)
        return RingPlan(self.world_size, steps, tuple(hand))


# --------------------------------------------------------------------------- exchange plans


@dataclasses.dataclass(frozen=True)
class GatherSlot:
    """One summary in an all-gather: rank ``rank`` writes, into row ``slot`` of its
    ``[slots_per_rank, ...]`` buffer, the summary of its fragment ``fragment`` (index into
    its fragments), which is chain position ``chain_pos`` of document ``doc``. In the
    gathered ``[W * slots_per_rank, ...]`` buffer it is row ``rank * slots_per_rank + slot``
    (:meth:`AllGatherPlan.fwd_index` / :meth:`AllGatherPlan.bwd_index`)."""

    rank: int
    slot: int
    fragment: int
    doc: int
    chain_pos: int


@dataclasses.dataclass(frozen=True)
class AllGatherPlan:
    """The ``"allgather"`` exchange: every rank publishes affine summaries, one all-gather
    (in the caller's group) per direction, then each rank folds the summaries it needs in a
    fixed order, in fp32.

    Forward: each fragment ``j`` that continues (``has_next``) publishes ``(P_j, Q_j)`` with
    ``S_end = P_j @ S_start + Q_j`` (``P_j``: the state transition ``[HV, K, K]``, ``Q_j``: the
    end state from a zero start ``[HV, K, V]``; FLA stores them side by side as one
    ``[HV, K, V + K]`` row). A fragment at chain position ``c > 0`` starts from
    ``S = 0; for j in 0 .. c-1: S = P_j @ S + Q_j`` (:attr:`RecvEntry.gather_sources`).

    Backward: each fragment ``j`` with a predecessor (``has_prev``) publishes
    ``(P_j^T, G_j)`` with ``dS_start = P_j^T @ dS_end + G_j`` (``G_j``: the start-state gradient
    from its own outputs with a zero ``dS_end``). A continuing fragment at chain position
    ``c`` of an ``n``-fragment chain gets ``dS_end = fold`` of ``j = n-1, n-2, .., c+1``
    (:attr:`SendEntry.gather_sources`).

    Slots: rank ``r``'s forward slots are its continuing fragments in local order (slot ``i``
    = ``ctx.send[i]``), its backward slots its fragments with a predecessor in local order
    (slot ``i`` = ``ctx.recv[i]``). Every rank's buffer has ``fwd_slots_per_rank`` (resp.
    ``bwd_slots_per_rank``) rows, the maximum over ranks, unused rows zero, so the
    collective is a plain ``all_gather_into_tensor``. ``*_slots_per_rank == 0``: nothing
    crosses a rank, skip that collective (every rank sees the same plan, so all skip).

    Fields: ``world_size``, ``fwd_slots_per_rank``, ``fwd_slots`` (every used forward slot,
    in ``(rank, slot)`` order), ``bwd_slots_per_rank``, ``bwd_slots``.
    """

    world_size: int
    fwd_slots_per_rank: int
    fwd_slots: tuple[GatherSlot, ...]
    bwd_slots_per_rank: int
    bwd_slots: tuple[GatherSlot, ...]

    def fwd_index(self, rank: int, slot: int) -> int:
        """Row of ``(rank, slot)`` in the gathered forward buffer."""
        return rank * self.fwd_slots_per_rank + slot

    def bwd_index(self, rank: int, slot: int) -> int:
        """Row of ``(rank, slot)`` in the gathered backward buffer."""
        return rank * self.bwd_slots_per_rank + slot


@dataclasses.dataclass(frozen=True)
class Handoff:
    """One ring hand-off: at step ``step`` (= the source's chain position), rank
    ``src_rank`` sends the end state of its fragment ``src_fragment`` (document ``doc``)
    to rank ``dst_rank``, whose fragment ``dst_fragment`` starts from it. The backward
    sends the start-state gradient the other way at the same step, steps in reverse order.
    ``src_rank == dst_rank`` is possible with explicit tables: a local copy, no message."""

    step: int
    doc: int
    src_rank: int
    src_fragment: int
    dst_rank: int
    dst_fragment: int


@dataclasses.dataclass(frozen=True)
class RingPlan:
    """The ``"ring"`` exchange: the exact state travels along each document's chain.

    Forward, for ``step = 0 .. num_steps-1``: every rank finishes its fragments at chain
    position ``step`` that continue (their start state arrived at step ``step - 1``, or is
    zero at position 0), sends each end state to the next fragment's rank and receives the
    states its fragments at position ``step + 1`` start from; ``handoffs`` lists them in
    ``(step, doc)`` order (post a step's sends and receives together, e.g.
    ``torch.distributed.batch_isend_irecv``, to avoid deadlock). Backward: steps
    ``num_steps-1 .. 0``, each hand-off reversed, carrying ``dS`` of the start state.
    ``num_steps = max chain length - 1`` (0: nothing crosses, no message).

    With every cut on a chunk boundary the local kernels then run exactly the chunk
    sequence the single-rank kernel runs, from the same state bits: the one case whose
    results do not depend on the partition (``docs/kcp.md``).
    """

    world_size: int
    num_steps: int
    handoffs: tuple[Handoff, ...]

    def for_rank(self, rank: int) -> tuple[Handoff, ...]:
        """The hand-offs rank ``rank`` sends or receives, in ``(step, doc)`` order."""
        return tuple(h for h in self.handoffs if rank in (h.src_rank, h.dst_rank))


# --------------------------------------------------------------------------- context parts


@dataclasses.dataclass(frozen=True)
class RecvEntry:
    """A local fragment whose document started earlier: it needs an incoming state.

    Fields: ``fragment`` (local index), ``doc``, ``chain_pos`` (>= 1), ``predecessors``
    (the document's earlier fragments as ``(rank, fragment index)`` in chain order; the
    last is the direct predecessor), ``gather_sources`` (their rows in the gathered
    forward buffer of :class:`AllGatherPlan`, in fold order ``0 .. chain_pos-1``).
    """

    fragment: int
    doc: int
    chain_pos: int
    predecessors: tuple[tuple[int, int], ...]
    gather_sources: tuple[int, ...]

    @property
    def prev(self) -> tuple[int, int]:
        """The direct predecessor ``(rank, fragment index)`` (the ring's source)."""
        return self.predecessors[-1]


@dataclasses.dataclass(frozen=True)
class SendEntry:
    """A local fragment whose document continues later: its end state is needed by others.

    Fields: ``fragment`` (local index), ``doc``, ``chain_pos``, ``successors`` (the
    document's later fragments as ``(rank, fragment index)`` in chain order; the first is
    the direct successor), ``gather_sources`` (the successors' rows in the gathered backward
    buffer of :class:`AllGatherPlan`, in fold order: last fragment first).
    """

    fragment: int
    doc: int
    chain_pos: int
    successors: tuple[tuple[int, int], ...]
    gather_sources: tuple[int, ...]

    @property
    def next(self) -> tuple[int, int]:
        """The direct successor ``(rank, fragment index)`` (the ring's destination)."""
        return self.successors[0]


@dataclasses.dataclass(frozen=True)
class HaloPiece:
    """Tokens ``[src_local_offset, src_local_offset + count)`` of rank ``src_rank``'s local
    array (inside its fragment ``src_fragment``), placed at rows ``[halo_offset,
    halo_offset + count)`` of the receiving fragment's ``[conv_kernel_size - 1]`` halo."""

    src_rank: int
    src_fragment: int
    src_local_offset: int
    count: int
    halo_offset: int


@dataclasses.dataclass(frozen=True)
class HaloEntry:
    """The causal-convolution halo of a local fragment with a predecessor.

    The halo is the ``conv_kernel_size - 1`` rows just before the fragment in its document,
    right-aligned: its last ``num_tokens = min(conv_kernel_size - 1, doc_offset)`` rows are
    the document's tokens ``[doc_offset - num_tokens, doc_offset)``, the rows before them
    zero (the document starts there). ``pieces`` give those tokens in document order; they
    may come from several earlier fragments and ranks when fragments are shorter than the
    halo, and from this rank itself (``src_rank == ctx.rank``: a local copy).
    """

    fragment: int
    num_tokens: int
    pieces: tuple[HaloPiece, ...]


@dataclasses.dataclass(frozen=True)
class HaloSend:
    """Tokens ``[src_local_offset, src_local_offset + count)`` of this rank (inside its
    fragment ``src_fragment``) that rank ``dst_rank`` needs at rows ``[halo_offset,
    halo_offset + count)`` of its fragment ``dst_fragment``'s halo (the sending side of a
    :class:`HaloPiece`; pieces a rank sends to itself are not listed)."""

    dst_rank: int
    dst_fragment: int
    src_fragment: int
    src_local_offset: int
    count: int
    halo_offset: int


@dataclasses.dataclass(frozen=True)
class ExchangeBytes:
    """Bytes one rank moves in one layer call (one forward + one backward).

    ``*_sent``: bytes this rank puts on the wire; ``*_received``: bytes it gets from other
    ranks; ``*_buffer``: bytes of the receive buffer it allocates (the all-gather output,
    which includes its own rows); ``*_calls``: collective calls (all-gather: 0 or 1) or
    point-to-point operations, sends plus receives (ring, halo). Formulas: ``docs/kcp.md``.
    """

    exchange: str
    fwd_sent: int
    fwd_received: int
    fwd_buffer: int
    fwd_calls: int
    bwd_sent: int
    bwd_received: int
    bwd_buffer: int
    bwd_calls: int

    @property
    def total_sent(self) -> int:
        return self.fwd_sent + self.bwd_sent

    @property
    def total_received(self) -> int:
        return self.fwd_received + self.bwd_received


def _itemsize(dtype: object) -> int:
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype: expected a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def _positive(v: object, name: str) -> int:
    i = _as_int(v, name)
    if i < 1:
        raise ValueError(f"{name}: must be >= 1, got {i}")
    return i


# --------------------------------------------------------------------------- context


@dataclasses.dataclass(frozen=True, eq=False)
class Context:
    """One rank's view of a :class:`Partition` on one device and process group.

    Made by :func:`build_context`; built once and reused by every layer of a step (it reads
    no tensor contents and runs no collective). Fields:

        partition: the :class:`Partition` (equal on every rank).
        group: the process group every collective goes through (``None``: the default
            group, or a single process without ``torch.distributed``).
        rank, world_size: this rank in ``group`` and ``W``.
        device: where the local tensors live.
        exchange: ``"allgather"`` or ``"ring"``.
        conv_kernel_size: the causal convolution's width ``Wc`` (halo ``Wc - 1`` rows).
        fragments: this rank's :class:`Fragment` objects in local order.
        num_tokens: this rank's token count ``T_r`` (0 is legal: skip the local kernels).
        cu_seqlens: int64 ``[n_frag + 1]`` on ``device``: each fragment one sequence.
        cu_seqlens_cpu: the same on the host.
        recv: :class:`RecvEntry` per local fragment with a predecessor, in local order
            (forward: needs an incoming state; backward: publishes / sends ``dS_start``).
        send: :class:`SendEntry` per local fragment with a successor, in local order
            (forward: publishes / sends its end state; backward: needs ``dS_end``).
        allgather_plan, ring_plan: both exchange plans (global, same on every rank);
            ``exchange_plan`` is the chosen one.
        halo: :class:`HaloEntry` per local fragment with a predecessor, in local order.
        halo_send: :class:`HaloSend` pieces this rank gives others, in
            ``(dst_rank, dst_fragment, halo_offset)`` order.
    """

    partition: Partition
    group: Any
    rank: int
    world_size: int
    device: torch.device
    exchange: str
    conv_kernel_size: int
    fragments: tuple[Fragment, ...]
    num_tokens: int
    cu_seqlens: torch.Tensor
    cu_seqlens_cpu: torch.Tensor
    recv: tuple[RecvEntry, ...]
    send: tuple[SendEntry, ...]
    allgather_plan: AllGatherPlan
    ring_plan: RingPlan
    halo: tuple[HaloEntry, ...]
    halo_send: tuple[HaloSend, ...]

    @property
    def exchange_plan(self) -> AllGatherPlan | RingPlan:
        """The plan of the chosen exchange."""
        return self.allgather_plan if self.exchange == "allgather" else self.ring_plan

    @property
    def num_fragments(self) -> int:
        """``n_frag``: the number of local sequences."""
        return len(self.fragments)

    @property
    def is_empty(self) -> bool:
        """Whether this rank holds no token (its local kernels must be skipped; it still
        takes part in every collective)."""
        return self.num_tokens == 0

    @property
    def crosses(self) -> bool:
        """Whether any document of the partition spans more than one fragment (else no
        state exchange is needed on any rank)."""
        return bool(self.allgather_plan.fwd_slots)

    def check_num_tokens(self, x: torch.Tensor | int, name: str = "x", dim: int = 1) -> None:
        """``ValueError`` unless ``x`` (a tensor, its ``dim``-th size, e.g. ``[1, T_r, ...]``;
        or an int) equals this rank's token count ``T_r``."""
        if isinstance(x, torch.Tensor):
            if not -x.dim() <= dim < x.dim():
                raise ValueError(f"{name}: expected a token dim {dim}, got shape "
                                 f"{tuple(x.shape)}")
            n = x.shape[dim]
        else:
            n = _as_int(x, name)
        if n != self.num_tokens:
            raise ValueError(f"{name}: holds {n} tokens, but rank {self.rank}'s context has "
                             f"{self.num_tokens}")

    def bytes_per_collective(self, K: int, V: int, HV: int,
                             dtype: torch.dtype = torch.float32) -> ExchangeBytes:
        """What this rank's state exchange moves per layer call, for GDN-style states
        ``[HV, K, V]`` and transitions ``[HV, K, K]`` of ``dtype`` (fp32 in cake's families).

        ``b = itemsize(dtype)``. All-gather (S = ``fwd_slots_per_rank``, resp. bwd): sent
        ``S * HV * K * (K + V) * b``, received ``(W - 1)`` times that, buffer ``W`` times that,
        one call when ``S > 0``. Ring: sent ``n_out * HV * K * V * b`` with ``n_out`` this rank's
        hand-offs to another rank, received likewise with ``n_in``; calls ``n_out + n_in``;
        the backward swaps sent and received.
        """
        K, V, HV = _positive(K, "K"), _positive(V, "V"), _positive(HV, "HV")
        b = _itemsize(dtype)
        if self.exchange == "allgather":
            row = HV * K * (K + V) * b
            w = self.world_size
            sf, sb = self.allgather_plan.fwd_slots_per_rank, self.allgather_plan.bwd_slots_per_rank
            return ExchangeBytes("allgather", sf * row, (w - 1) * sf * row, w * sf * row,
                                 int(sf > 0), sb * row, (w - 1) * sb * row, w * sb * row,
                                 int(sb > 0))
        state = HV * K * V * b
        mine = self.ring_plan.for_rank(self.rank)
        n_out = sum(1 for h in mine if h.src_rank == self.rank and h.dst_rank != self.rank)
        n_in = sum(1 for h in mine if h.dst_rank == self.rank and h.src_rank != self.rank)
        return ExchangeBytes("ring", n_out * state, n_in * state, n_in * state, n_out + n_in,
                             n_in * state, n_out * state, n_out * state, n_out + n_in)

    def halo_bytes(self, channels: int, dtype: torch.dtype) -> ExchangeBytes:
        """What the convolution halo moves per layer call, point to point, for ``channels``
        features of ``dtype`` per token: forward sent ``sum(halo_send counts) * channels * b``,
        received ``sum(counts of halo pieces from other ranks) * channels * b``; the backward
        returns the halo rows' gradients the other way. Calls count pieces (sends plus
        receives); a family may also move the halo with one padded all-gather instead."""
        c = _positive(channels, "channels")
        b = _itemsize(dtype)
        out = sum(s.count for s in self.halo_send)
        pieces_in = [p for e in self.halo for p in e.pieces if p.src_rank != self.rank]
        inn = sum(p.count for p in pieces_in)
        calls = len(self.halo_send) + len(pieces_in)
        return ExchangeBytes("halo", out * c * b, inn * c * b, inn * c * b, calls,
                             inn * c * b, out * c * b, out * c * b, calls)


def _group_world_rank(group: Any) -> tuple[int, int]:
    """(world size, rank) of ``group``; no collective. ``None`` without an initialised
    default group is a single process: (1, 0)."""
    import torch.distributed as dist

    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: a process group was given but torch.distributed is not "
                         "initialised")
    return dist.get_world_size(group), dist.get_rank(group)


def build_context(partition: Partition, group: Any, rank: int,
                  device: torch.device | str | int, conv_kernel_size: int = 4, *,
                  exchange: str = "allgather", check_group: bool = True) -> Context:
    """Rank ``rank``'s :class:`Context` for ``partition``.

    Args:
        partition: a :class:`Partition` (the same on every rank).
        group: the process group of the context-parallel ranks, or ``None``: the default
            group when ``torch.distributed`` is initialised, else a single process (then
            ``partition.world_size`` must be 1 and ``rank`` 0).
        rank: this process's rank in ``group`` (checked against ``dist.get_rank(group)``).
        device: the device of the local tensors; ``ctx.cu_seqlens`` is copied there.
        conv_kernel_size: the causal convolution's width ``Wc >= 1`` (halo ``Wc - 1``).
        exchange: ``"allgather"`` or ``"ring"`` (see :class:`AllGatherPlan`,
            :class:`RingPlan`).
        check_group: ``True`` (the default): check ``group``'s size and this process's
            rank in it. ``False``: ``group`` is stored unqueried; for tools and tests that
            build every rank's context in one process (such a context must not run
            collectives).

    Reads no tensor contents and runs no collective: only ``dist.get_world_size(group)``
    and ``dist.get_rank(group)``, which are local queries.

    Raises:
        ValueError: ``partition`` not a :class:`Partition`; ``rank`` not an int in
            ``[0, W)``; ``rank`` not this process's rank in ``group``; the group's size not
            ``partition.world_size``; this process not in ``group``; a bad
            ``conv_kernel_size`` or ``exchange``; ``device`` not a device, or a CUDA
            device this process cannot use.
    """
    if not isinstance(partition, Partition):
        raise ValueError(f"partition: expected a cake_core.kcp.Partition, got "
                         f"{type(partition).__name__}")
    w = partition.world_size
    r = _as_int(rank, "rank")
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange: expected one of {EXCHANGES}, got {exchange!r}")
    wc = _positive(conv_kernel_size, "conv_kernel_size")
    if not isinstance(check_group, bool):
        raise ValueError(f"check_group: expected a bool, got {check_group!r}")
    if check_group:
        gw, gr = _group_world_rank(group)
        if gr < 0:
            raise ValueError("group: this process is not a member of the group")
        if gw != w:
            raise ValueError(f"partition: made for world_size {w}, but the process group has "
                             f"{gw} ranks")
    if not 0 <= r < w:
        raise ValueError(f"rank: must be in [0, {w}), got {r}")
    if check_group and r != gr:
        raise ValueError(f"rank: got {r}, but this process is rank {gr} of the group")
    try:
        dev = (torch.device("cuda", device) if isinstance(device, int) and
               not isinstance(device, bool) else torch.device(device))
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: not a device: {device!r} ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {dev} requested, but this torch has no usable CUDA device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device: {dev} requested, but only {torch.cuda.device_count()} CUDA "
                         f"devices are visible")

    frags = partition.table[r]
    ag = partition.allgather_plan()
    ring = partition.ring_plan()
    fwd_row = {(s.rank, s.fragment): ag.fwd_index(s.rank, s.slot) for s in ag.fwd_slots}
    bwd_row = {(s.rank, s.fragment): ag.bwd_index(s.rank, s.slot) for s in ag.bwd_slots}

    recv, send, halo, halo_send = [], [], [], []
    for i, f in enumerate(frags):
        chain = partition.doc_chain(f.doc)
        if f.has_prev:
            pred = chain[:f.chain_pos]
            recv.append(RecvEntry(i, f.doc, f.chain_pos, pred,
                                  tuple(fwd_row[p] for p in pred)))
        if f.has_next:
            succ = chain[f.chain_pos + 1:]
            send.append(SendEntry(i, f.doc, f.chain_pos, succ,
                                  tuple(bwd_row[s] for s in reversed(succ))))
    # halo: for every fragment (any rank) with a predecessor, pieces in document order
    for dst_rank, dst_frags in enumerate(partition.table):
        for di, f in enumerate(dst_frags):
            if not f.has_prev:
                continue
            n = min(wc - 1, f.doc_offset)
            lo = f.doc_offset - n
            pieces = []
            for sr, si in partition.doc_chain(f.doc)[:f.chain_pos]:
                g = partition.table[sr][si]
                a, b_ = max(lo, g.doc_offset), g.doc_offset + g.length
                if a >= b_:
                    continue
                pieces.append(HaloPiece(sr, si, g.local_offset + a - g.doc_offset, b_ - a,
                                        (wc - 1 - n) + a - lo))
            if dst_rank == r:
                halo.append(HaloEntry(di, n, tuple(pieces)))
            for p in pieces:
                if p.src_rank == r and dst_rank != r:
                    halo_send.append(HaloSend(dst_rank, di, p.src_fragment,
                                              p.src_local_offset, p.count, p.halo_offset))

    cu_cpu = partition.local_cu_seqlens(r)
    return Context(
        partition=partition, group=group, rank=r, world_size=w, device=dev, exchange=exchange,
        conv_kernel_size=wc, fragments=frags, num_tokens=int(cu_cpu[-1]),
        cu_seqlens=cu_cpu.to(dev), cu_seqlens_cpu=cu_cpu, recv=tuple(recv), send=tuple(send),
        allgather_plan=ag, ring_plan=ring, halo=tuple(halo), halo_send=tuple(halo_send),
    )


# --------------------------------------------------------------------------- the -kcp entries
# What every ``-kcp`` family's ``partition_det_kcp`` / ``build_context_det_kcp`` /
# ``check_context`` does (their messages name those entries' arguments).


def partition_det_kcp(cu_seqlens_global_cpu: torch.Tensor | Sequence[int], world_size: int,
                      layout: str = "contiguous",
                      fragments: Sequence[object] | None = None) -> Partition:
    """The body of every ``-kcp`` family's ``partition_det_kcp`` (see theirs):
    :meth:`Partition.from_cu_seqlens` for a layout, else :meth:`Partition.from_fragments`
    with ``T = cu_seqlens_global_cpu[-1]`` (``layout`` then ``"contiguous"`` or
    ``"explicit"``).

    Raises:
        ValueError: bad offsets, world size, layout or fragment table (naming the argument),
            or a layout other than the default together with ``fragments``.
    """
    if fragments is None:
        return Partition.from_cu_seqlens(cu_seqlens_global_cpu, world_size, layout)
    if layout not in ("contiguous", "explicit"):
        raise ValueError(f"layout: {layout!r} cannot be combined with an explicit fragment "
                         "table (leave layout at its default)")
    cu = cu_seqlens_global_cpu
    if isinstance(cu, torch.Tensor):
        if cu.dim() != 1 or cu.numel() < 1:
            raise ValueError("cu_seqlens_global_cpu: expected a 1-D tensor with at least 2 "
                             f"entries, got shape {tuple(cu.shape)}")
        total = cu[-1]
    elif isinstance(cu, (list, tuple)) and cu:
        total = cu[-1]
    else:
        raise ValueError("cu_seqlens_global_cpu: expected a CPU int tensor or a non-empty list "
                         f"of ints, got {type(cu).__name__}")
    return Partition.from_fragments(fragments, world_size, total, cu_seqlens=cu)


def build_context_det_kcp(partition: Partition, group: Any, rank: int,
                          device: torch.device | str | int, conv_kernel_size: int = 4, *,
                          exchange: str = "allgather") -> Context:
    """The body of every ``-kcp`` family's ``build_context_det_kcp`` (see theirs): refuse
    anything but a :class:`Partition` (naming ``partition_det_kcp``), then
    :func:`build_context`."""
    if not isinstance(partition, Partition):
        raise ValueError(f"partition: expected a cake_core.kcp.Partition (from "
                         f"partition_det_kcp), got {type(partition).__name__}")
    return build_context(partition, group, rank, device, conv_kernel_size, exchange=exchange)


def _process_world_rank(group: Any) -> tuple[int, int] | None:
    """``(world size, rank)`` of ``group`` (local queries), or ``None`` without an
    initialised ``torch.distributed``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_world_size(group), dist.get_rank(group)


def check_context(ctx: object, device: torch.device | None = None) -> Context:
    """``ValueError`` unless ``ctx`` is a :class:`Context` this process can run collectives
    with: its group has ``ctx.world_size`` ranks and this process is rank ``ctx.rank`` in it
    (a context made for another rank or world size, e.g. with ``check_group=False``, is
    refused) and, with ``device``, it was built for that device. Runs no collective; every
    ``-kcp`` entry calls it before any collective. Returns ``ctx``."""
    if not isinstance(ctx, Context):
        raise ValueError(f"ctx: expected a cake_core.kcp.Context (from build_context_det_kcp), "
                         f"got {type(ctx).__name__}")
    wr = _process_world_rank(ctx.group)
    if wr is None:
        if ctx.group is not None:
            raise ValueError("ctx: its process group is set but torch.distributed is not "
                             "initialised")
        if ctx.world_size != 1:
            raise ValueError(f"ctx: made for world_size {ctx.world_size}, but torch.distributed "
                             "is not initialised (a single process is world size 1)")
        if ctx.rank != 0:
            raise ValueError(f"ctx: made for rank {ctx.rank}, but this single process is rank 0")
    else:
        gw, gr = wr
        if gr < 0:
            raise ValueError("ctx: this process is not a member of the context's group")
        if gw != ctx.world_size:
            raise ValueError(f"ctx: made for world_size {ctx.world_size}, but its process group "
                             f"has {gw} ranks")
        if gr != ctx.rank:
            raise ValueError(f"ctx: made for rank {ctx.rank}, but this process is rank {gr} of "
                             "its group")
    if device is not None:
        want = ctx.device
        if want.type != device.type or (want.index is not None and device.index is not None
                                         and want.index != device.index):
            raise ValueError(f"ctx: built for device {want}, but the tensors are on {device}")
    return ctx


def _plain(v: object) -> object:
    """A JSON-able form of an option value (plans and enums by their fields / value)."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"class": type(v).__name__,
                **{f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    return getattr(v, "value", None) if hasattr(v, "value") else repr(v)


def _short(v: object, n: int = 120) -> str:
    t = json.dumps(v, sort_keys=True)
    return t if len(t) <= n else t[:n] + "..."


def agree_once(ctx: Context, entry: str, **options: object) -> None:
    """Before ``entry``'s first collective on ``ctx``: the ranks of ``ctx.group`` check that
    they agree, so that a job whose ranks were given different partitions or options fails
    on every rank with a message instead of hanging in a collective.

    Each rank hashes one description, ``entry``, the partition's key and layout label,
    ``ctx.world_size``,
    ``ctx.exchange``, ``ctx.conv_kernel_size`` and ``options`` (head counts, dims, dtypes,
    flags, the plan: whatever the entry's collectives depend on), to 16 bytes; one
    all-gather of them (``torch.distributed.all_gather`` on ``ctx.device`` under NCCL, on
    the host otherwise), read on the host. Equal everywhere: the entry is marked agreed on
    ``ctx`` and later calls of it return at once (no collective, no host sync). Else the
    descriptions themselves are all-gathered (``all_gather_object``) and every rank raises.

    Only the first call of each entry on a context is compared: options that diverge between
    ranks after their first calls agreed are not detected. A single process without
    ``torch.distributed`` (``W = 1``) compares nothing.

    Raises:
        ValueError: ``"<entry>: the ranks of ctx.group disagree before the first collective:
            <field>: rank 0 <value>, rank 1 <value>; ..."`` on every rank.
    """
    agreed = ctx.__dict__.setdefault("_agreed_entries", set())
    if entry in agreed:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        agreed.add(entry)
        return
    desc = {"entry": entry, "partition": ctx.partition.key,
            "layout": ctx.partition.layout, "world_size": ctx.world_size,
            "exchange": ctx.exchange, "conv_kernel_size": ctx.conv_kernel_size,
            **{k: _plain(v) for k, v in options.items()}}
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).digest()[:16]
    dev = ctx.device if dist.get_backend(ctx.group) == "nccl" else torch.device("cpu")
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64).to(dev)
    rows = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(rows, mine, group=ctx.group)
    got = [tuple(r.tolist()) for r in rows]
    if len(set(got)) == 1:
        agreed.add(entry)
        return
    descs: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(descs, desc, group=ctx.group)
    keys = sorted({k for d in descs for k in d})
    differ = [k for k in keys if len({_short(d.get(k), 10**6) for d in descs}) > 1]
    raise ValueError(
        f"{entry}: the ranks of ctx.group disagree before the first collective: " + "; ".join(
            f"{k}: " + ", ".join(f"rank {r} {_short(d.get(k))}" for r, d in enumerate(descs))
            for k in differ))


@functools.lru_cache(maxsize=64)
def has_middle_fragments(partition: Partition) -> bool:
    """Whether some fragment of the partition both receives and sends a state (a document
    spans three or more fragments). Only such fragments need their transition ``P`` in
    either direction; without any, the all-gather rows carry ``Q`` (or ``G``) alone, ``V``
    wide instead of ``K + V`` (the same decision on every rank)."""
    return any(f.has_prev and f.has_next for frags in partition.table for f in frags)
