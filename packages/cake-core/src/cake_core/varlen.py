"""Host-side helpers for packed (varlen) sequences and chunked kernels.

Families that walk packed sequences in fixed-size chunks (GDN, KDA) build the same tables
on the host: the sequences' offsets, the chunk table, the most chunks a capacity can hold,
and the fixed-order sum of per-value-head gradients into their q/k heads. Plain torch only:
importing this module imports no Triton.
"""

from __future__ import annotations

import torch

__all__ = ["chunk_tables", "group_sum", "max_chunks", "seq_offsets"]


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
