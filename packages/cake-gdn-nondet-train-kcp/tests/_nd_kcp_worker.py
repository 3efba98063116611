"""Multi-process worker of the gloo test: ``python _nd_kcp_worker.py W OUTDIR``.

Spawns ``W`` processes (``torch.multiprocessing``), each joins a gloo group
(``file://OUTDIR/rdzv``; NCCL with one GPU per rank on CUDA), runs :data:`CASES` on its
shard of the global inputs (the same seeded tensors in every process) with this package's
low-level pair and its autograd entry, and writes ``OUTDIR/rank<r>.pt``: per case the
rank-local o and gradients, and whether the autograd entry gave the same bits.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback

import torch

#: name -> (global cu_seqlens, layout, exchange, use_qk_l2norm_in_kernel, HV, seed)
CASES = {
    # two ranks, contiguous: document 1 spans the cut (the all-gather's first / last)
    "allgather": ([0, 30, 90, 100], "contiguous", "allgather", True, 2, 3),
    # zigzag: a document that comes back to rank 0, handed along the ring
    "ring": ([0, 20, 100], "zigzag", "ring", False, 1, 5),
}
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def partition_of(case, W):
    from cake_gdn_nondet_train_kcp import partition_nondet_kcp

    return partition_nondet_kcp(torch.tensor(case[0], dtype=torch.int64), W, case[1])


def _device(rank):
    return torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")


def _run(case, rank, W):
    from _gdn_nd_kcp_helpers import global_inputs
    from cake_core.testing import bitwise_equal
    from cake_gdn_nondet_train_kcp import (
        build_context_nondet_kcp,
        chunk_gated_delta_rule_nondet_kcp,
        chunk_gdn_nondet_bwd_kcp,
        chunk_gdn_nondet_fwd_kcp,
        comm_bytes_nondet,
    )

    cu, _, exchange, l2, HV, seed = case
    p = partition_of(case, W)
    dev = _device(rank)
    ctx = build_context_nondet_kcp(p, None, rank, dev, exchange=exchange)
    idx = p.global_index(rank).to(dev)
    xs = [t[:, idx].contiguous() for t in global_inputs(cu[-1], HV=HV, seed=seed, device=dev)]
    o, saved = chunk_gdn_nondet_fwd_kcp(*xs[:5], ctx, use_qk_l2norm_in_kernel=l2)
    first = (o, *chunk_gdn_nondet_bwd_kcp(xs[5], saved, ctx))
    leaves = [t.clone().requires_grad_() for t in xs[:5]]
    o = chunk_gated_delta_rule_nondet_kcp(*leaves, ctx, use_qk_l2norm_in_kernel=l2)
    o.backward(xs[5])
    got = (o.detach(), *(t.grad for t in leaves))
    out = {n: t.cpu() for n, t in zip(NAMES, first, strict=True)}
    out["autograd_same"] = all(bitwise_equal(a, b) for a, b in zip(got, first, strict=True))
    with count_collective_bytes() as (moved, phase):  # a steady-state step (agreed)
        o, saved = chunk_gdn_nondet_fwd_kcp(*xs[:5], ctx, use_qk_l2norm_in_kernel=l2)
        phase[0] = "bwd"
        chunk_gdn_nondet_bwd_kcp(xs[5], saved, ctx)
    out["moved"] = dict(moved)
    out["comm_bytes"] = comm_bytes_nondet(ctx, xs[0].shape[3], xs[2].shape[3], xs[2].shape[2])
    return out


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


def _rank_main(rank, W, outdir):
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            init_method="file://" + os.path.join(outdir, "rdzv"), rank=rank,
                            world_size=W, timeout=datetime.timedelta(seconds=240))
    results = {}
    try:
        for name, case in CASES.items():
            try:
                results[name] = _run(case, rank, W)
            except Exception:  # noqa: BLE001 - reported to the test
                results[name] = {"error": traceback.format_exc()}
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    W, outdir = int(sys.argv[1]), sys.argv[2]
    mp.spawn(_rank_main, args=(W, outdir), nprocs=W, join=True)
    print("ok")
