"""Multi-process worker of the KCP tests (CPU, gloo): ``python _kcp_worker.py W OUTDIR CASES``.

Spawns ``W`` processes (``torch.multiprocessing``), each joins a gloo group
(``file://OUTDIR/rdzv``), runs the named cases on its shard of the global inputs (the same
seeded tensors in every process) and writes its results to ``OUTDIR/rank<r>.pt``: per
case the rank-local o and gradients of a first run, whether a second run repeated them
bitwise, and, where the case asks, the autograd entry's results and bad-input messages.
The tests (``test_gdn_kcp_dist.py``) compare them with the single-rank package on the
global tensors; they import ``CASES`` from this file's path.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback

import torch

#: name -> (world size, global cu_seqlens, layout or explicit fragment rows, exchange,
#: use_qk_l2norm_in_kernel, HV, seed, flags). Flags: "aligned" (every cut on a 64-token chunk
#: boundary: the ring must reproduce the single-rank bits), "autograd" (also run the
#: autograd entry), "bad" (bad-input checks on a live group), "mismatch" (rank 1 is given
#: the zigzag partition of the same documents: only the forward's ValueError is recorded).
CASES = {
    # W = 2: a 1-token fragment at the end of rank 0, documents on one rank, one spanning two
    "w2_contig_ag": (2, [0, 40, 41, 64, 130], "contiguous", "allgather", False, 2, 1, ()),
    "w2_contig_ring": (2, [0, 40, 41, 64, 130], "contiguous", "ring", False, 2, 1, ()),
    # zigzag: a document that comes back to rank 0 (chain 1 -> 0), one 0 -> 1
    "w2_zigzag_ag": (2, [0, 40, 41, 64, 130], "zigzag", "allgather", False, 1, 2,
                     ("autograd",)),
    "w2_zigzag_ring": (2, [0, 40, 41, 64, 130], "zigzag", "ring", False, 1, 2, ()),
    # every document in 2W parts: each crosses both ranks (the 1-token one sits on rank 0)
    "w2_zdoc_ag": (2, [0, 40, 41, 64, 130], "zigzag_per_document", "allgather", False, 2, 12,
                   ()),
    # one token over two ranks: rank 0 is empty (nothing crosses)
    "w2_empty_ag": (2, [0, 1], "contiguous", "allgather", False, 1, 3, ()),
    "w2_l2n_ag": (2, [0, 3, 90, 100], "zigzag", "allgather", True, 1, 4, ("autograd", "bad")),
    "w2_mismatch": (2, [0, 40, 41, 64, 130], "contiguous", "allgather", False, 1, 11,
                    ("mismatch",)),
    # W = 3: one document over every rank (a middle fragment on rank 1), short ones around it
    "w3_contig_ag": (3, [0, 5, 120, 121, 150], "contiguous", "allgather", False, 1, 5, ()),
    "w3_contig_ring": (3, [0, 5, 120, 121, 150], "contiguous", "ring", False, 1, 5, ()),
    # zigzag: document 1 visits ranks 0, 1, 2, 1 (rank 1 holds two of its fragments)
    "w3_zigzag_ag": (3, [0, 5, 120, 121, 150], "zigzag", "allgather", False, 1, 6, ()),
    "w3_zigzag_ring": (3, [0, 5, 120, 121, 150], "zigzag", "ring", True, 1, 6, ()),
    # two tokens over three ranks: rank 0 empty, two 1-token fragments of one document
    "w3_empty_ag": (3, [0, 2], "contiguous", "allgather", False, 1, 10, ()),
    "w3_empty_ring": (3, [0, 2], "contiguous", "ring", False, 1, 10, ()),
    # cuts on chunk boundaries, rank 1 empty: the ring reproduces the single-rank bits
    "w3_aligned_ring": (3, [0, 150, 160],
                        [(0, 0, 0, 64), (2, 1, 0, 10), (2, 0, 64, 64), (0, 0, 128, 22)],
                        "ring", False, 1, 7, ("aligned",)),
    "w3_aligned_ring_l2n": (3, [0, 192], "contiguous", "ring", True, 1, 8, ("aligned",)),
    # W = 4: one document over all four ranks (two middle fragments), zigzag
    "w4_zigzag_ag": (4, [0, 2, 100], "zigzag", "allgather", False, 1, 9, ()),
    "w4_zigzag_ring": (4, [0, 2, 100], "zigzag", "ring", False, 1, 9, ()),
}



def global_inputs(T: int, HV: int, seed: int, device="cpu"):
    """The global fp32 inputs of a case (the tests build the same)."""
    from _gdn_kcp_helpers import global_inputs as make

    return make(T, HV=HV, seed=seed, device=device)


def partition_of(case):
    from cake_gdn_det_train_kcp import partition_det_kcp

    W, cu, layout = case[0], case[1], case[2]
    cu_t = torch.tensor(cu, dtype=torch.int64)
    if isinstance(layout, str):
        return partition_det_kcp(cu_t, W, layout)
    return partition_det_kcp(cu_t, W, fragments=layout)


NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def _device(rank):
    """Each rank's device: GPU ``rank`` when CUDA is there (NCCL), else the CPU (gloo)."""
    return torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")


def _run(case, rank):
    from cake_core.testing import bitwise_equal
    from cake_gdn_det_train_kcp import (
        build_context_det_kcp,
        chunk_gated_delta_rule_det_kcp,
        chunk_gdn_det_bwd_kcp,
        chunk_gdn_det_fwd_kcp,
        comm_bytes,
    )

    W, cu, _, exchange, l2, HV, seed, flags = case
    p = partition_of(case)
    if "mismatch" in flags and rank == 1:
        p = partition_of((W, cu, "zigzag"))
    dev = _device(rank)
    ctx = build_context_det_kcp(p, None, rank, dev, exchange=exchange)
    idx = p.global_index(rank).to(dev)
    xs = [t[:, idx].contiguous() for t in global_inputs(cu[-1], HV, seed, dev)]

    def once(phase=None):
        o, saved = chunk_gdn_det_fwd_kcp(*xs[:5], ctx, use_qk_l2norm_in_kernel=l2)
        if phase is not None:
            phase[0] = "bwd"
        return (o, *chunk_gdn_det_bwd_kcp(xs[5], saved, ctx))

    if "mismatch" in flags:  # every rank must raise, before any other collective
        try:
            once()
        except ValueError as e:
            return {"mismatch": str(e)}
        return {"mismatch": None}
    with _count_local_calls() as calls, count_collective_bytes() as (moved_first, phase):
        first = once(phase)  # the first step: the ranks' agreements too
    with count_collective_bytes() as (moved, phase):  # a steady-state step (agreed)
        second = once(phase)
    out = {n: t for n, t in zip(NAMES, first, strict=True)}
    out["moved"], out["moved_first"] = dict(moved), dict(moved_first)
    out["comm_bytes"] = comm_bytes(ctx, xs[0].shape[3], xs[2].shape[3], xs[2].shape[2])
    out["local_calls"] = dict(calls)
    out["num_tokens"] = ctx.num_tokens
    out["repeat"] = all(bitwise_equal(a, b) for a, b in zip(first, second, strict=True))
    if "autograd" in flags:
        leaves = [t.clone().requires_grad_() for t in xs[:5]]
        o = chunk_gated_delta_rule_det_kcp(*leaves, ctx, use_qk_l2norm_in_kernel=l2)
        o.backward(xs[5])
        got = (o.detach(), *(t.grad for t in leaves))
        out["autograd_same"] = all(bitwise_equal(a, b) for a, b in zip(got, first, strict=True))
    if "bad" in flags:
        out["bad"] = _bad_inputs(p, ctx, xs, rank, W)
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


@contextlib.contextmanager
def count_collective_bytes():
    """Sums what ``torch.distributed.all_gather`` and ``batch_isend_irecv`` move on this
    rank in the block, as ``comm_bytes`` counts it: an all-gather sends its input's bytes
    and receives the other ranks' rows, a point-to-point op sends or receives its tensor's;
    ``calls`` counts all-gathers and point-to-point ops. Yields ``(moved, phase)``: set
    ``phase[0] = "bwd"`` when the backward starts."""
    import torch.distributed as dist

    moved = dict.fromkeys(("fwd_sent", "fwd_received", "bwd_sent", "bwd_received", "calls"), 0)
    phase = ["fwd"]
    real = dist.all_gather, dist.batch_isend_irecv

    def all_gather(outs, send, *a, **k):
        moved[f"{phase[0]}_sent"] += send.nbytes
        moved[f"{phase[0]}_received"] += sum(t.nbytes for t in outs) - send.nbytes
        moved["calls"] += 1
        return real[0](outs, send, *a, **k)

    def batch_isend_irecv(ops):
        for op in ops:
            way = "sent" if op.op is dist.isend else "received"
            moved[f"{phase[0]}_{way}"] += op.tensor.nbytes
            moved["calls"] += 1
        return real[1](ops)

    dist.all_gather, dist.batch_isend_irecv = all_gather, batch_isend_irecv
    try:
        yield moved, phase
    finally:
        dist.all_gather, dist.batch_isend_irecv = real


@contextlib.contextmanager
def _count_local_calls():
    """Counts the single-rank calls the KCP entries make (``fwd`` / ``bwd``)."""
    import cake_gdn_det_train_kcp.api as api

    calls = {"fwd": 0, "bwd": 0}
    real = api.chunk_gdn_det_fwd, api.chunk_gdn_det_bwd

    def fwd(*a, **k):
        calls["fwd"] += 1
        return real[0](*a, **k)

    def bwd(*a, **k):
        calls["bwd"] += 1
        return real[1](*a, **k)

    api.chunk_gdn_det_fwd, api.chunk_gdn_det_bwd = fwd, bwd
    try:
        yield calls
    finally:
        api.chunk_gdn_det_fwd, api.chunk_gdn_det_bwd = real


def _bad_inputs(p, ctx, xs, rank, W):
    """Bad inputs on a live group: each must raise ValueError and run no collective.
    Returns the messages (a ``"NO ERROR: ..."`` entry when a call went through)."""
    from cake_core.kcp import build_context
    from cake_core.testing import refusals_without_collectives
    from cake_gdn_det_train_kcp import (
        build_context_det_kcp,
        chunk_gdn_det_bwd_kcp,
        chunk_gdn_det_fwd_kcp,
        partition_det_kcp,
    )

    with refusals_without_collectives() as (expect, msgs):
        cu = torch.tensor(p.cu_seqlens)
        expect("partition for another world size",
               lambda: build_context_det_kcp(partition_det_kcp(cu, W + 1), None, rank,
                                             ctx.device))
        other = build_context(p, None, (rank + 1) % W, ctx.device, check_group=False)
        expect("context from another rank", lambda: chunk_gdn_det_fwd_kcp(*xs[:5], other))
        longer = [torch.cat([t, t[:, :1]], dim=1) for t in xs[:5]]
        expect("length disagrees with ctx", lambda: chunk_gdn_det_fwd_kcp(*longer, ctx))
        expect("bad dtype", lambda: chunk_gdn_det_fwd_kcp(xs[0].double(), *xs[1:5], ctx))
        _, saved = chunk_gdn_det_fwd_kcp(*xs[:5], ctx)  # a good one (its collectives run)
        expect("backward with a context from another rank",
               lambda: chunk_gdn_det_bwd_kcp(xs[5], saved, other))
        expect("backward with do of another length",
               lambda: chunk_gdn_det_bwd_kcp(longer[2], saved, ctx))
    return msgs


def _rank_main(rank, W, outdir, names):
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            init_method="file://" + os.path.join(outdir, "rdzv"), rank=rank,
                            world_size=W, timeout=datetime.timedelta(seconds=240))
    results = {}
    try:
        for name in names:
            try:
                results[name] = _run(CASES[name], rank)
            except Exception:  # noqa: BLE001 - reported to the test
                results[name] = {"error": traceback.format_exc()}
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    W, outdir, names = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
    mp.spawn(_rank_main, args=(W, outdir, names), nprocs=W, join=True)
    print("ok")
