"""Host-side helpers for packed (varlen) sequences and chunked kernels.

Families that walk packed sequences in fixed-size chunks (GDN, KDA) build the same tables
on the host: the sequences' offsets, the chunk table, the most chunks a capacity can hold,
and the fixed-order sum of per-value-head gradients into their q/k heads. Plain torch only:
importing this module imports no Triton.

:func:`checked_offsets` validates a ``cu_seqlens`` and reads it back to the host once per
tensor version (a small cache), so that repeated calls with the same unchanged tensor skip
the device sync; :func:`offsets_derived` keeps tables built from those offsets (e.g. a block
table already on the device) alongside.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from cake_core.checks import check_cu_seqlens

__all__ = ["OFFSETS_CACHE_SIZE", "checked_offsets", "chunk_tables", "clear_offsets_cache",
           "group_sum", "max_chunks", "offsets_derived", "seq_offsets"]

#: How many validated ``cu_seqlens`` (tensor versions) :func:`checked_offsets` remembers.
OFFSETS_CACHE_SIZE = 8
#: How many derived values (:func:`offsets_derived`) one cached ``cu_seqlens`` keeps.
_DERIVED_PER_ENTRY = 16


class _Entry:
    """One validated ``cu_seqlens`` version. ``tensor`` and ``storage`` are strong
    references: while the entry lives, neither the tensor object (its ``id``) nor its memory
    (its ``data_ptr``) can be reused by another tensor, so the key cannot match a stranger."""

    __slots__ = ("derived", "offsets", "snapshot", "storage", "tensor")

    def __init__(self, tensor, storage, offsets, snapshot):
        self.tensor, self.storage, self.offsets, self.snapshot = tensor, storage, offsets, snapshot
        self.derived: dict[Hashable, Any] = {}


_cache: OrderedDict[tuple, _Entry] = OrderedDict()
_lock = threading.Lock()


def clear_offsets_cache() -> None:
    """Forget every ``cu_seqlens`` :func:`checked_offsets` remembers (and their derived
    tables), dropping the references the cache holds."""
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
        while len(_cache) > OFFSETS_CACHE_SIZE:
            _cache.popitem(last=False)
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
        if len(e.derived) >= _DERIVED_PER_ENTRY:
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


def max_chunks(num_tokens: int, num_seqs: int, chunk_size: int) -> int:
    """The most ``chunk_size``-token chunks that ``num_seqs`` sequences of ``num_tokens``
    tokens in all can form (what a workspace sized for that capacity must hold): each
    sequence adds at most one partial chunk, and no chunk is empty."""
    return min(num_tokens, (num_tokens + (chunk_size - 1) * num_seqs) // chunk_size)


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
