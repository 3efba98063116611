"""Multi-process worker of the nondet KDA KCP tests (CPU, gloo; NCCL with CUDA):
``python _nd_kcp_worker.py NPROC OUTDIR``.

Spawns ``NPROC`` processes that join one group (``file://OUTDIR/rdzv``) and run every case
of :data:`CASES` on their shard of the global inputs (the same seeded tensors in every
process): the low-level pair, then the autograd entry. Each process writes
``OUTDIR/proc<p>.pt``: per case its rank-local o and gradients (dA_log / ddt_bias too) of
both runs. ``test_kda_nondet_kcp_dist.py`` compares them with cake-kda-nondet-train on the
global tensors.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback

import torch

#: name -> (global cu_seqlens, layout, exchange, seed): FLA's gate and the beta sigmoid
#: (Kimi Linear's call). zigzag over two ranks: document 1 comes back to rank 0, document
#: 0 goes 0 -> 1
CASES = {
    "zigzag_ag": ([0, 30, 48], "zigzag", "allgather", 2),
    "zigzag_ring": ([0, 30, 48], "zigzag", "ring", 3),
}

NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")


def partition_of(case, world_size):
    from cake_kda_nondet_train_kcp import partition_nondet_kcp

    return partition_nondet_kcp(torch.tensor(case[0], dtype=torch.int64), world_size, case[1])


def _run(case, rank, W, dev):
    from _kda_nd_kcp_helpers import autograd_run, global_inputs, kcp_run, shard
    from cake_kda_nondet_train_kcp import build_context_nondet_kcp

    p = partition_of(case, W)
    ctx = build_context_nondet_kcp(p, None, rank, dev, exchange=case[2])
    xs, kw = global_inputs(case[0][-1], seed=case[3], device=dev)
    local = shard(xs, p, rank)
    out = {"low": kcp_run(local, ctx, kw), "autograd": autograd_run(local, ctx, kw)}
    out = {k: [t.cpu() if t is not None else None for t in v] for k, v in out.items()}
    out["moved"], out["comm_bytes"] = _moved_and_comm_bytes(ctx, local, kw)
    return out


def _moved_and_comm_bytes(ctx, local, kw):
    """What the collectives of one more steady-state step (the low-level pair, gate
    gradients reduced) move on this rank, and what ``comm_bytes_nondet`` says."""
    from cake_kda_det_train_kcp.context import gate_grad_width
    from cake_kda_nondet_train_kcp import (
        chunk_kda_nondet_bwd_kcp,
        chunk_kda_nondet_fwd_kcp,
        comm_bytes_nondet,
    )

    with count_collective_bytes() as (moved, phase):
        _, saved = chunk_kda_nondet_fwd_kcp(*local[:5], ctx, **kw)
        phase[0] = "bwd"
        chunk_kda_nondet_bwd_kcp(local[5], saved, ctx)
    K, HV, V = local[0].shape[3], local[2].shape[2], local[2].shape[3]
    gate = bool(kw.get("use_gate_in_kernel"))
    floats = gate_grad_width(HV, K, gate and kw.get("A_log") is not None,
                             gate and kw.get("dt_bias") is not None)
    return dict(moved), comm_bytes_nondet(ctx, K, V, HV, gate_grad_floats=floats)


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


def _proc_main(proc, nproc, outdir):
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(proc)
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method="file://" + os.path.join(outdir, "rdzv"), rank=proc,
                            world_size=nproc, timeout=datetime.timedelta(seconds=600))
    dev = torch.device("cuda", proc) if cuda else torch.device("cpu")
    results = {}
    try:
        for name, case in CASES.items():
            try:
                results[name] = _run(case, proc, nproc, dev)
            except Exception:  # noqa: BLE001 - reported to the test
                results[name] = {"error": traceback.format_exc()}
        torch.save(results, os.path.join(outdir, f"proc{proc}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    nproc, outdir = int(sys.argv[1]), sys.argv[2]
    mp.spawn(_proc_main, args=(nproc, outdir), nprocs=nproc, join=True)
    print("ok")
