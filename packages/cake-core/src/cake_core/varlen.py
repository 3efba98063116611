"""Host-side helpers for packed (varlen) sequences and chunked kernels.

Families that walk packed sequences in fixed-size chunks (GDN, KDA) build the same tables
on the host: the sequences' offsets, the chunk table, the most chunks a capacity can hold,
and the fixed-order sum of per-value-head gradients into their q/k heads. Plain torch only:
importing this module imports no Triton.

:func:`checked_offsets` validates a ``cu_seqlens`` and reads it back to the host once per
tensor version (a small cache), so that repeated calls with the same unchanged tensor skip
the device sync; :func:`offsets_derived` keeps tables built from those offsets (e.g. a block
table already on the device) alongside. :func:`resolve_chunks` resolves the sequences of a
chunked call (GDN, KDA) once into one :class:`SeqChunks` (host offsets, chunk tables, their
device copies), kept in that same cache.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from cake_core.checks import check_cu_seqlens

__all__ = ["OFFSETS_CACHE_SIZE", "SeqChunks", "checked_offsets", "chunk_tables",
           "clear_offsets_cache", "group_sum", "max_chunks", "offsets_derived",
           "resolve_chunks", "seq_offsets"]

#: How many validated ``cu_seqlens`` (tensor versions) :func:`checked_offsets` remembers
#: (with the fixed-length rows and the device offsets :func:`resolve_chunks` keeps there).
OFFSETS_CACHE_SIZE = 16
#: How many derived values (:func:`offsets_derived`) one cached ``cu_seqlens`` keeps.
_DERIVED_PER_ENTRY = 16


class _Entry:
    """One validated ``cu_seqlens`` version. ``tensor`` and ``storage`` are strong
    references: while the entry lives, neither the tensor object (its ``id``) nor its memory
    (its ``data_ptr``) can be reused by another tensor, so the key cannot match a stranger."""

    __slots__ = ("derived", "offsets", "pinned", "snapshot", "storage", "tensor")

    def __init__(self, tensor, storage, offsets, snapshot):
        self.tensor, self.storage, self.offsets, self.snapshot = tensor, storage, offsets, snapshot
        self.derived: dict[Hashable, Any] = {}
        # used while a CUDA graph was captured: the graph reads its tables at every replay,
        # so the entry is never pushed out (until clear_offsets_cache)
        self.pinned = _capturing()


def _evict_locked() -> None:
    """Push out the least recently used entries beyond :data:`OFFSETS_CACHE_SIZE`, never a
    pinned one (call with ``_lock`` held)."""
    over = len(_cache) - OFFSETS_CACHE_SIZE
    if over > 0:
        for k in [k for k, e in _cache.items() if not e.pinned][:over]:
            del _cache[k]


_cache: OrderedDict[tuple, _Entry] = OrderedDict()
_lock = threading.Lock()


def clear_offsets_cache() -> None:
    """Forget every ``cu_seqlens`` :func:`checked_offsets` remembers (and their derived
    tables), dropping the references the cache holds, pinned entries too: call it only once
    no CUDA graph that read them will be replayed."""
    with _lock:
        _cache.clear()


def _cacheable(t: torch.Tensor) -> bool:
    """Plain eager tensors only: not while torch.compile traces, not a tensor subclass (fake,
    functional, meta-like wrappers), not an inference tensor (it has no version counter)."""
    return (type(t) is torch.Tensor and not t.is_inference() and not t.is_meta
            and not torch.compiler.is_compiling())


def _key(t: torch.Tensor, n_tokens: int) -> tuple:
    return (id(t), t._version, t.data_ptr(), t.dtype, t.device, tuple(t.shape),
            tuple(t.stride()), t.storage_offset(), n_tokens)


def _lookup(t: torch.Tensor, n_tokens: int) -> _Entry | None:
    key = _key(t, n_tokens)
    with _lock:
        e = _cache.get(key)
        if e is None or e.tensor is not t:
            return None
        _cache.move_to_end(key)
        e.pinned = e.pinned or _capturing()
    # A CPU tensor can be written without a version bump (through .numpy(), .data): compare
    # its values, which costs no device sync.
    if e.snapshot is not None and not torch.equal(t.detach(), e.snapshot):
        with _lock:
            _cache.pop(key, None)
        return None
    return e


def checked_offsets(cu_seqlens: torch.Tensor, n_tokens: int,
                    device: torch.device | None = None, *,
                    name: str = "cu_seqlens") -> torch.Tensor:
    """:func:`cake_core.check_cu_seqlens` and the int64 CPU offsets ``[N + 1]``, remembered per
    tensor version: repeated calls with the same unchanged tensor read nothing back from the
    device (no sync) and validate nothing again.

    Args:
        cu_seqlens: ``[N + 1]`` int32/int64 offsets on any device.
        n_tokens: the token count the offsets must end at.
        device: the inputs' device (``cu_seqlens`` must be on a device of its type).
        name: the argument's name in error messages.

    Returns:
        int64 CPU offsets ``[N + 1]`` owned by the cache (never the caller's memory): read
        them, do not modify them.

    Raises:
        ValueError: as :func:`cake_core.check_cu_seqlens`, before anything is remembered.
        The rules that read no values (type, dtype, rank, length, device type) run on every
        call; the value rules run on a miss.

    The cache (the last :data:`OFFSETS_CACHE_SIZE` tensor versions, least recently used
    first out) is keyed on the tensor object (``id``, held by a strong reference so that it
    cannot be reused), its ``_version`` counter (every in-place torch op bumps it, also
    through a view), its ``data_ptr`` (its storage is held too), dtype, shape, strides and
    ``n_tokens``. A CPU ``cu_seqlens`` is also compared by value on each hit (no sync). Not
    cached, checked on every call: while torch.compile traces, tensor subclasses (fake /
    functional tensors), inference tensors. A device tensor written behind torch's back
    (``.data``, DLPack / CuPy / a raw kernel: no version bump) is not seen: call
    :func:`clear_offsets_cache` after such a write. The cache keeps each remembered tensor
    (and the base of a view) alive until it is pushed out.
    """
    check_cu_seqlens(cu_seqlens, n_tokens, device, name=name, read_values=False)
    t = cu_seqlens
    if not _cacheable(t):
        return check_cu_seqlens(t, n_tokens, device, name=name)
    e = _lookup(t, n_tokens)
    if e is not None:
        return e.offsets
    key = _key(t, n_tokens)
    v = check_cu_seqlens(t, n_tokens, device, name=name)
    cpu = t.device.type == "cpu"
    offsets = v.clone() if cpu else v  # a CPU int64 tensor comes back as itself
    snapshot = t.detach().clone() if cpu else None
    e = _Entry(t, t.untyped_storage(), offsets, snapshot)
    with _lock:
        _cache[key] = e
        _cache.move_to_end(key)
        _evict_locked()
    return offsets


def offsets_derived(cu_seqlens: torch.Tensor | None, offsets: torch.Tensor, key: Hashable,
                    build: Callable[[], Any]) -> Any:
    """``build()``, remembered with the :func:`checked_offsets` entry of ``cu_seqlens``.

    ``offsets`` must be what :func:`checked_offsets` returned for it; the value is remembered
    only while that entry is cached and is still the one that returned this very
    ``offsets`` object (otherwise ``build()`` runs each call and nothing is kept). ``key``
    names the value (e.g. ``("my_family.block_table", block_t, device)``); ``build`` must
    depend only on ``offsets`` and ``key``, and its result must never be modified (it is
    shared by later calls). Derived values leave with their entry.
    """
    if cu_seqlens is None or not _cacheable(cu_seqlens):
        return build()
    e = _lookup(cu_seqlens, int(offsets[-1])) if offsets.numel() else None
    if e is None or e.offsets is not offsets:
        return build()
    with _lock:
        if key in e.derived:
            return e.derived[key]
    value = build()
    with _lock:
        if len(e.derived) >= _DERIVED_PER_ENTRY and not e.pinned:
            e.derived.clear()
        e.derived[key] = value
    return value


def seq_offsets(cu_seqlens: torch.Tensor | None, B: int, T: int) -> torch.Tensor:
    """int64 CPU offsets ``[N + 1]`` of the sequences in the flattened ``B * T`` tokens.

    Args:
        cu_seqlens: ``[N + 1]`` int32/int64 offsets on any device (already checked, e.g. by
            :func:`cake_core.check_cu_seqlens`), or ``None``: then the ``B`` rows of ``T``
            tokens are the sequences, ``[0, T, 2T, ..., BT]``.
        B, T: batch size and sequence length of the inputs.

    Reads a device tensor back to the host (one sync). An int64 CPU ``cu_seqlens`` comes
    back as itself (detached, same memory), as ``Tensor.to`` does.
    """
    if cu_seqlens is None:
        return torch.arange(B + 1, dtype=torch.int64) * T
    return cu_seqlens.detach().to("cpu", torch.int64)


def chunk_tables(cu: torch.Tensor, chunk_size: int):
    """The chunk table of packed sequences.

    Args:
        cu: int64 CPU offsets ``[N + 1]`` (as :func:`seq_offsets` returns). Empty sequences
            (equal neighbours) are allowed and form no chunk.
        chunk_size: tokens per chunk (> 0); a sequence's last chunk may be shorter.

    Returns:
        ``(starts, ends, chunk_off, NC)``: int32 CPU ``starts`` and ``ends`` ``[NC]`` (the
        token range ``[start, end)`` of each chunk), int32 CPU ``chunk_off`` ``[N + 1]``
        (sequence ``n`` owns chunks ``chunk_off[n] .. chunk_off[n + 1] - 1``) and the chunk
        count ``NC`` (an int). Chunks of a sequence are consecutive, in token order, and
        sequences follow each other in order.
    """
    bos, eos = cu[:-1], cu[1:]
    per_seq = (eos - bos + chunk_size - 1) // chunk_size
    chunk_off = torch.zeros(cu.numel(), dtype=torch.int64)
    chunk_off[1:] = torch.cumsum(per_seq, 0)
    NC = int(chunk_off[-1])
    seq = torch.repeat_interleave(torch.arange(per_seq.numel()), per_seq)
    local = torch.arange(NC, dtype=torch.int64) - chunk_off[seq]
    starts = bos[seq] + chunk_size * local
    ends = torch.minimum(starts + chunk_size, eos[seq])
    i32 = torch.int32
    return starts.to(i32), ends.to(i32), chunk_off.to(i32), NC


# ----------------------------------------------------------------------------- SeqChunks

_CHUNKS = "cake_core.varlen.SeqChunks"
#: the cache key of fixed-length rows (no ``cu_seqlens``): ``(_ROWS, B, T)``
_ROWS = "cake_core.varlen.rows"
# rows are kept while tensors are (cake_core.testing.offsets_cache_disabled turns both off)
_ROWS_PROBE = torch.empty(0)


def _stream_of(device: torch.device) -> int | None:
    # tables are only reused on the stream they were copied on (the copy is ordered before
    # the launches there, and their memory is freed on the stream that read them)
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None


@dataclasses.dataclass(frozen=True, eq=False)
class SeqChunks:
    """The packed sequences of one chunked call, resolved once by :func:`resolve_chunks`:
    what the launches read and what the saved set keeps for the backward.

    Attributes:
        offsets: int64 CPU offsets ``[N + 1]`` (validated).
        chunk_size: tokens per chunk.
        num_chunks: the chunk count ``NC`` (:func:`chunk_tables`).
        device, stream: where the tables below live, and the CUDA stream they were copied on
            (``None`` off CUDA).
        starts, ends: int32 ``[NC]`` on ``device``: each chunk's token range ``[start, end)``.
        chunk_off: int32 ``[N + 1]`` on ``device``: sequence ``n`` owns chunks
            ``chunk_off[n] .. chunk_off[n + 1] - 1``.
        cu: int64 ``[N + 1]`` on ``device``: the offsets (a saved set's ``cu_seqlens``).

    Shared by the calls of the same unchanged ``cu_seqlens`` (or row shape): read it,
    never modify its tensors.
    """

    offsets: torch.Tensor
    chunk_size: int
    num_chunks: int
    device: torch.device
    stream: int | None
    starts: torch.Tensor
    ends: torch.Tensor
    chunk_off: torch.Tensor
    cu: torch.Tensor
    host: torch.Tensor | None = None  # the pinned bytes a captured upload reads at replay

    @property
    def num_seqs(self) -> int:
        """The sequence count ``N``."""
        return self.offsets.numel() - 1

    @property
    def tables(self) -> tuple:
        """``(starts, ends, chunk_off, cu, NC)``, the order the families' launches take."""
        return self.starts, self.ends, self.chunk_off, self.cu, self.num_chunks

    def tables_on(self, device: torch.device) -> tuple:
        """:attr:`tables` when ``device`` and its current stream are the ones they were
        copied for; else the same tables copied there (one upload, kept by nothing; while
        a CUDA graph is captured, kept in the offsets cache and pinned, with the pinned host
        block its captured upload reads at every replay)."""
        if device == self.device and _stream_of(device) == self.stream:
            return self.tables
        seqs = _build_chunks(self.offsets, self.chunk_size, device)
        if _capturing():  # the graph reads these tables (and seqs.host) at every replay
            _remember_device_offsets(seqs, (_CHUNKS, self.chunk_size, device, seqs.stream))
        return seqs.tables


def _upload(offsets: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
            chunk_off: torch.Tensor, device: torch.device) -> tuple:
    """``(starts, ends, chunk_off, cu, host)`` on ``device`` in one host-to-device copy: the
    int64 offsets and the three int32 tables packed as bytes (offsets first: 8-byte aligned),
    from pinned memory without waiting on CUDA (the copy is ordered before the launches on
    the current stream; torch keeps the pinned block until the copy is done). While a CUDA
    graph is captured the copy is captured too and reads the pinned block again at every
    replay: ``host`` is that block, for the caller to keep as long as the graph (else None)."""
    parts = [offsets.contiguous(), starts.contiguous(), ends.contiguous(),
             chunk_off.contiguous()]
    raw = [t.view(torch.uint8) for t in parts]
    host = torch.cat(raw)
    keep = None
    if device.type == "cuda":
        host = host.pin_memory()
        dev = host.to(device, non_blocking=True)
        keep = host if torch.cuda.is_current_stream_capturing() else None
    else:
        dev = host.to(device)
    out, at = [], 0
    for t, r in zip(parts, raw, strict=True):
        out.append(dev[at:at + r.numel()].view(t.dtype))
        at += r.numel()
    cu, starts_d, ends_d, chunk_off_d = out
    return starts_d, ends_d, chunk_off_d, cu, keep


def _build_chunks(offsets: torch.Tensor, chunk_size: int, device: torch.device) -> SeqChunks:
    """The one place a :class:`SeqChunks` is made: the host tables of ``offsets``
    (:func:`chunk_tables`) and their upload to ``device``."""
    starts, ends, chunk_off, nc = chunk_tables(offsets, chunk_size)
    starts_d, ends_d, chunk_off_d, cu, host = _upload(offsets, starts, ends, chunk_off, device)
    return SeqChunks(offsets, chunk_size, nc, device, _stream_of(device), starts_d, ends_d,
                     chunk_off_d, cu, host)


def _capturing() -> bool:
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _remember_device_offsets(seqs: SeqChunks, key: tuple) -> None:
    """Keep ``seqs`` under its own device offsets ``seqs.cu`` too: a backward that is given
    them (a saved ``cu_seqlens``) resolves to this very object, reading nothing back."""
    t = seqs.cu
    if not _cacheable(t):
        return
    k = _key(t, int(seqs.offsets[-1]))
    with _lock:
        e = _cache.get(k)
        if e is None or e.tensor is not t:
            snapshot = t.detach().clone() if t.device.type == "cpu" else None
            e = _Entry(t, t.untyped_storage(), seqs.offsets, snapshot)
            _cache[k] = e
        e.derived.setdefault(key, seqs)
        e.pinned = e.pinned or _capturing()
        _cache.move_to_end(k)
        _evict_locked()


def _rows_chunks(B: int, T: int, key: tuple, device: torch.device,
                 chunk_size: int) -> SeqChunks:
    """The :class:`SeqChunks` of ``B`` rows of ``T`` tokens, kept per ``(B, T)`` (pinned
    while a CUDA graph is captured: the graph reads the tables at every replay)."""
    if not _cacheable(_ROWS_PROBE):
        return _build_chunks(seq_offsets(None, B, T), chunk_size, device)
    rk = (_ROWS, B, T)
    with _lock:
        e = _cache.get(rk)
        if e is not None:
            _cache.move_to_end(rk)
            e.pinned = e.pinned or _capturing()
            seqs = e.derived.get(key)
            if seqs is not None:
                return seqs
    offsets = e.offsets if e is not None else seq_offsets(None, B, T)
    seqs = _build_chunks(offsets, chunk_size, device)
    with _lock:
        e = _cache.get(rk)
        if e is None:
            e = _Entry(None, None, offsets, None)
            _cache[rk] = e
        if len(e.derived) >= _DERIVED_PER_ENTRY and not e.pinned:
            e.derived.clear()
        e.derived[key] = seqs
        _cache.move_to_end(rk)
        _evict_locked()
    _remember_device_offsets(seqs, key)
    return seqs


def resolve_chunks(cu_seqlens: torch.Tensor | None, B: int, T: int, device: torch.device,
                   chunk_size: int, *, name: str = "cu_seqlens") -> SeqChunks:
    """The sequences of a chunked call, resolved once into one :class:`SeqChunks`.

    Args:
        cu_seqlens: ``[N + 1]`` int32/int64 offsets of the sequences in the ``B * T``
            tokens (packed inputs have ``B == 1``), or ``None``: the ``B`` rows of ``T``
            tokens are the sequences.
        B, T: batch size and sequence length of the inputs.
        device: the inputs' device (the tables are copied there).
        chunk_size: tokens per chunk (> 0).
        name: the argument's name in error messages.

    Returns:
        The call's :class:`SeqChunks`, kept in :func:`checked_offsets`' cache (the one
        cache): a later call with the same unchanged ``cu_seqlens`` (or the same ``B, T``
        without it), on the same device and stream, gets this very object and reads back,
        builds and uploads nothing; so does a call given its device offsets ``.cu`` (a saved
        set's ``cu_seqlens``). Nothing is kept for what :func:`checked_offsets` does not
        cache, nor for rows while a CUDA graph is captured.

    Raises:
        ValueError: as :func:`cake_core.check_cu_seqlens` (``name: ...``), before anything
            is built or kept.
    """
    key = (_CHUNKS, chunk_size, device, _stream_of(device))
    if cu_seqlens is None:
        return _rows_chunks(B, T, key, device, chunk_size)
    offsets = checked_offsets(cu_seqlens, B * T, device, name=name)
    seqs = offsets_derived(cu_seqlens, offsets, key,
                           lambda: _build_chunks(offsets, chunk_size, device))
    _remember_device_offsets(seqs, key)
    return seqs


def max_chunks(num_tokens: int, num_seqs: int, chunk_size: int) -> int:
    """The most ``chunk_size``-token chunks that ``num_seqs`` sequences of ``num_tokens``
    tokens in all can form (what a workspace sized for that capacity must hold): each
    sequence adds at most one partial chunk, and no chunk is empty. Symbolic sizes (a
    custom op's fake under ``torch.compile``) give a symbolic size, without a guard."""
    return torch.sym_min(num_tokens, (num_tokens + (chunk_size - 1) * num_seqs) // chunk_size)


def group_sum(x: torch.Tensor, H: int) -> torch.Tensor:
    """``[NT, HV, K]`` per value head -> ``[NT, H, K]``: each of the ``H`` q/k heads gets the
    sum of its ``HV // H`` consecutive value heads, added in index order
    (``((x[:, h*G] + x[:, h*G+1]) + x[:, h*G+2]) + ...``, ``G = HV // H``; fixed order: no
    atomics, no library reduction). ``HV == H`` returns ``x`` itself; otherwise a new
    tensor of x's dtype. ``x`` must be viewable as ``[NT, H, G, K]`` (e.g. contiguous).
    """
    NT, HV, K = x.shape
    group = HV // H
    if group == 1:
        return x
    x = x.view(NT, H, group, K)
    acc = x[:, :, 0].clone()
    for j in range(1, group):
        acc += x[:, :, j]
    return acc
