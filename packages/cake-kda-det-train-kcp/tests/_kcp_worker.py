"""Multi-process worker of the KDA KCP tests (CPU, gloo): ``python _kcp_worker.py NPROC
OUTDIR CASES``.

Spawns ``NPROC`` processes (``torch.multiprocessing``; KDA under the interpreter is slow,
so one set of processes serves every world size); they join a gloo group
(``file://OUTDIR/rdzv``) and make one subgroup per world size ``W < NPROC`` out of the
*last* ``W`` processes (``torch.distributed.new_group``), so group ranks differ from global
ranks (the ring maps them for its point-to-point calls). A case of world size ``W`` runs on
the processes of its group, each on its shard of the global inputs (the same seeded tensors
in every process); the others skip it. Each process writes ``OUTDIR/proc<p>.pt``: per case
(on its group rank) the rank-local o and gradients (dA_log / ddt_bias too) of a first run,
whether a second run repeated them bitwise, and, where the case asks, the autograd entry's
results, the rank's own gate-parameter share and bad-input messages; and whether the
rank-order sum of made-up gate-parameter shares came out right in every group. The tests
(``test_kda_kcp_dist.py``) compare the results with the single-rank package on the global
tensors; they import ``CASES`` from this file's path.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback

import torch

#: name -> (world size, global cu_seqlens, layout or explicit fragment rows, exchange,
#: input kind (_kda_kcp_helpers.KINDS), HV, seed, flags). Flags: "aligned" (every cut on a
#: 64-token chunk boundary: the ring must reproduce the single-rank bits), "autograd" (also
#: run the autograd entry as the second run), "share" (the first run with
#: reduce_gate_param_grads=False, the
#: repeat with True: each rank's share, and their rank-order sum, are checked), "bad"
#: (bad-input checks on a live group).
CASES = {
    # W = 2, FLA's gate. contiguous: a 1-token fragment at the end of rank 0 (a cut off the
    # chunk grid); the reduced gate-parameter gradients against each rank's share
    "w2_contig_ag": (2, [0, 23, 48], "contiguous", "allgather", "gate", 1, 1, ("share",)),
    # contiguous, one cut on the chunk grid: the ring gives the single-rank bits (the gate
    # sums: tolerance)
    "w2_aligned_ring": (2, [0, 128], "contiguous", "ring", "gate", 1, 4, ("aligned",)),
    # zigzag: document 1 comes back to rank 0 (chain 1 -> 0), document 0 goes 0 -> 1
    "w2_zigzag_ag": (2, [0, 30, 48], "zigzag", "allgather", "gate", 1, 2,
                     ("autograd", "bad")),
    "w2_zigzag_ring": (2, [0, 30, 48], "zigzag", "ring", "gate", 1, 2, ()),
    # one token over two ranks: rank 0 is empty (nothing crosses; it still joins the
    # gate-parameter sum)
    "w2_empty_ag": (2, [0, 1], "contiguous", "allgather", "gate", 1, 3, ()),
    # W = 3. contiguous: document 0 over every rank (a middle fragment on rank 1), strong
    # per-channel decays (down to -20 per token)
    "w3_contig_ring": (3, [0, 44, 48], "contiguous", "ring", "strong", 1, 5, ()),
    # two tokens: rank 0 empty, two 1-token fragments of one document
    "w3_empty_ag": (3, [0, 2], "contiguous", "allgather", "gate", 1, 7, ()),
    "w3_empty_ring": (3, [0, 2], "contiguous", "ring", "gate", 1, 7, ()),
    # zigzag: document 1 visits ranks 0, 1, 2, 1, 0 (three middle fragments, two on rank
    # 1), the lower-bound gate with the L2 norm, local shares, the autograd entry
    "w3_zigzag_ag": (3, [0, 2, 48], "zigzag", "allgather", "gate_lb", 1, 6,
                     ("autograd", "share")),
    # zigzag, 2-token parts: one document visits ranks 0, 1, 2, 1, 0 on the ring
    "w3_zigzag_ring": (3, [0, 12], "zigzag", "ring", "l2", 1, 9, ()),
    # W = 4: one document over all four ranks (two middle fragments: a fold of three rows)
    "w4_contig_ag": (4, [0, 24], "contiguous", "allgather", "gate", 1, 8, ()),
}

NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")


def case_inputs(case, device="cpu"):
    """The global inputs ``(xs, kw)`` of a case (the tests build the same)."""
    from _kda_kcp_helpers import global_inputs

    _, cu, _, _, kind, HV, seed, _ = case
    return global_inputs(cu[-1], HV=HV, seed=seed, device=device, kind=kind)


def partition_of(case):
    from cake_kda_det_train_kcp import partition_det_kcp

    W, cu, layout = case[0], case[1], case[2]
    cu_t = torch.tensor(cu, dtype=torch.int64)
    if isinstance(layout, str):
        return partition_det_kcp(cu_t, W, layout)
    return partition_det_kcp(cu_t, W, fragments=layout)


def _device(proc):
    """Each process's device: GPU ``proc`` when CUDA is there (NCCL), else the CPU (gloo)."""
    return torch.device("cuda", proc) if torch.cuda.is_available() else torch.device("cpu")


def procs_of(W: int, nproc: int) -> list[int]:
    """The global ranks (processes) of world size ``W``'s group, in group-rank order."""
    return list(range(nproc - W, nproc))


def _run(case, rank, group, dev):
    from _kda_kcp_helpers import autograd_run, kcp_run
    from cake_core.testing import bitwise_equal
    from cake_kda_det_train_kcp import build_context_det_kcp

    W, cu, _, exchange, _, HV, seed, flags = case
    p = partition_of(case)
    ctx = build_context_det_kcp(p, group, rank, dev, exchange=exchange)
    xs, kw = case_inputs(case, dev)
    idx = p.global_index(rank).to(dev)
    xs = [t[:, idx].contiguous() for t in xs]

    share = "share" in flags
    with _count_local_calls() as calls:
        first = kcp_run(xs, ctx, kw, reduce_gate_param_grads=not share)
    # the second run: the autograd entry where the case asks (bitwise the low-level pair's)
    second = autograd_run(xs, ctx, kw) if "autograd" in flags else kcp_run(xs, ctx, kw)
    out = {n: t for n, t in zip(NAMES, second if share else first, strict=True)}
    out["local_calls"] = dict(calls)
    out["num_tokens"] = ctx.num_tokens
    out["repeat"] = all(bitwise_equal(a, b) for a, b in zip(first[:6], second[:6], strict=True))
    if share:
        out["share_dA_log"], out["share_ddt_bias"] = first[6], first[7]
    else:
        out["repeat"] = out["repeat"] and all(
            (a is None and b is None) or bitwise_equal(a, b)
            for a, b in zip(first[6:], second[6:], strict=True))
    out["moved"], out["comm_bytes"] = _moved_and_comm_bytes(ctx, xs, kw)
    if "bad" in flags:
        out["bad"] = _bad_inputs(p, ctx, xs, kw, rank, W, group)
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


def _moved_and_comm_bytes(ctx, xs, kw):
    """What the collectives of one more steady-state step (the low-level pair, gate
    gradients reduced) move on this rank, and what ``comm_bytes`` says they move."""
    from cake_kda_det_train_kcp import chunk_kda_det_bwd_kcp, chunk_kda_det_fwd_kcp, comm_bytes
    from cake_kda_det_train_kcp.context import gate_grad_width

    with count_collective_bytes() as (moved, phase):
        _, saved = chunk_kda_det_fwd_kcp(*xs[:5], ctx, **kw)
        phase[0] = "bwd"
        chunk_kda_det_bwd_kcp(xs[5], saved, ctx)
    K, HV, V = xs[0].shape[3], xs[2].shape[2], xs[2].shape[3]
    gate = bool(kw.get("use_gate_in_kernel"))
    floats = gate_grad_width(HV, K, gate and kw.get("A_log") is not None,
                             gate and kw.get("dt_bias") is not None)
    return dict(moved), comm_bytes(ctx, K, V, HV, gate_grad_floats=floats)


@contextlib.contextmanager
def _count_local_calls():
    """Counts the single-rank calls the KCP entries make (``fwd`` / ``bwd``)."""
    import cake_kda_det_train_kcp.api as api

    calls = {"fwd": 0, "bwd": 0}
    real = api.chunk_kda_det_fwd, api.chunk_kda_det_bwd

    def fwd(*a, **k):
        calls["fwd"] += 1
        return real[0](*a, **k)

    def bwd(*a, **k):
        calls["bwd"] += 1
        return real[1](*a, **k)

    api.chunk_kda_det_fwd, api.chunk_kda_det_bwd = fwd, bwd
    try:
        yield calls
    finally:
        api.chunk_kda_det_fwd, api.chunk_kda_det_bwd = real


def _bad_inputs(p, ctx, xs, kw, rank, W, group):
    """Bad inputs on a live group: each must raise ValueError and run no collective.
    Returns the messages (a ``"NO ERROR: ..."`` entry when a call went through)."""
    from cake_core.kcp import build_context
    from cake_core.testing import refusals_without_collectives
    from cake_kda_det_train_kcp import (
        build_context_det_kcp,
        chunk_kda_det_bwd_kcp,
        chunk_kda_det_fwd_kcp,
        partition_det_kcp,
    )

    with refusals_without_collectives() as (expect, msgs):
        cu = torch.tensor(p.cu_seqlens)
        expect("partition for another world size",
               lambda: build_context_det_kcp(partition_det_kcp(cu, W + 1), group, rank,
                                             ctx.device))
        other = build_context(p, group, (rank + 1) % W, ctx.device, check_group=False)
        expect("context from another rank", lambda: chunk_kda_det_fwd_kcp(*xs[:5], other, **kw))
        longer = [torch.cat([t, t[:, :1]], dim=1) for t in xs[:5]]
        expect("length disagrees with ctx", lambda: chunk_kda_det_fwd_kcp(*longer, ctx, **kw))
        expect("bad dtype", lambda: chunk_kda_det_fwd_kcp(xs[0].double(), *xs[1:5], ctx, **kw))
        expect("per-head g (GDN's shape)",
               lambda: chunk_kda_det_fwd_kcp(*xs[:3], xs[3][..., 0], xs[4], ctx, **kw))
        expect("gate without A_log or lower_bound",
               lambda: chunk_kda_det_fwd_kcp(*xs[:5], ctx, **dict(kw, A_log=None)))
        expect("reduce flag not a bool",
               lambda: chunk_kda_det_fwd_kcp(*xs[:5], ctx, **kw, reduce_gate_param_grads=1))
        _, saved = chunk_kda_det_fwd_kcp(*xs[:5], ctx, **kw)  # a good one (collectives run)
        expect("backward with a context from another rank",
               lambda: chunk_kda_det_bwd_kcp(xs[5], saved, other))
        expect("backward with do of another length",
               lambda: chunk_kda_det_bwd_kcp(longer[2], saved, ctx))
        expect("backward with a reduce flag not a bool",
               lambda: chunk_kda_det_bwd_kcp(xs[5], saved, ctx, reduce_gate_param_grads="yes"))
    return msgs


def _made_up_share(rank: int) -> torch.Tensor:
    return torch.randn(37, generator=torch.Generator().manual_seed(100 + rank)) * 10 ** rank


def _check_sum_over_ranks(ctx_rank, W, group, dev):
    """exchange.sum_over_ranks on made-up shares of very different sizes (so the order of
    the sum shows in the bits): the rank-order sum, on every rank."""
    from cake_core.testing import bitwise_equal
    from cake_kda_det_train_kcp import build_context_det_kcp, partition_det_kcp
    from cake_kda_det_train_kcp.exchange import sum_over_ranks

    ctx = build_context_det_kcp(partition_det_kcp([0, W], W), group, ctx_rank, dev)
    got = sum_over_ranks(_made_up_share(ctx_rank).to(dev), ctx).cpu()
    want = _made_up_share(0).clone()
    for r in range(1, W):
        want.add_(_made_up_share(r))
    return bitwise_equal(got, want)


def _proc_main(proc, nproc, outdir, names):
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(proc)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            init_method="file://" + os.path.join(outdir, "rdzv"), rank=proc,
                            world_size=nproc, timeout=datetime.timedelta(seconds=900))
    dev = _device(proc)
    groups = {nproc: None}
    for W in range(2, nproc):  # every process creates every group, in the same order
        groups[W] = dist.new_group(procs_of(W, nproc))
    results = {"sum_over_ranks_ok": True}
    try:
        for W in range(2, nproc + 1):
            if proc in procs_of(W, nproc):
                rank = procs_of(W, nproc).index(proc)
                ok = _check_sum_over_ranks(rank, W, groups[W], dev)
                results["sum_over_ranks_ok"] = results["sum_over_ranks_ok"] and ok
        for name in names:
            W = CASES[name][0]
            if proc not in procs_of(W, nproc):
                continue
            try:
                results[name] = _run(CASES[name], procs_of(W, nproc).index(proc), groups[W],
                                     dev)
            except Exception:  # noqa: BLE001 - reported to the test
                results[name] = {"error": traceback.format_exc()}
        torch.save(results, os.path.join(outdir, f"proc{proc}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    nproc, outdir, names = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
    mp.spawn(_proc_main, args=(nproc, outdir, names), nprocs=nproc, join=True)
    print("ok")
