"""Multi-process worker of the KCP tests (CPU, gloo): ``python _kcp_worker.py W OUTDIR CASES``.

Spawns ``W`` processes (``torch.multiprocessing``), each joins a gloo group
(``file://OUTDIR/rdzv``), runs the named cases on its shard of the global inputs (the same
seeded tensors in every process) and writes its results to ``OUTDIR/rank<r>.pt``: per
case the rank-local y, dx and dweight / dbias shares of a first run, the reduced dweight /
dbias of a ``reduce_weight_grads=True`` run, whether second runs repeated both bitwise,
how many all-gathers and local kernel calls each made, and, where the case asks, the
autograd entry's results and bad-input messages. The tests (``test_conv_kcp_dist.py``)
compare them with the single-rank package and the float64 reference on the global
tensors; they import ``CASES`` from this file's path.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback
from typing import NamedTuple

import torch


class Case(NamedTuple):
    """A distributed test case. ``layout``: ``"contiguous"``, ``"zigzag"`` or explicit
    fragment rows ``(rank, doc, doc_offset, length)``. Flags: ``"autograd"`` (also run the
    autograd entry), ``"bad"`` (bad-input checks on a live group)."""

    world: int
    cu: list
    layout: object
    kernel_size: int
    activation: str | None
    bias: bool
    D: int
    seed: int
    flags: tuple = ()


CASES = {
    # W = 2: a 1-token document on rank 0, a document across the cut
    "w2_contig_k4_silu": Case(2, [0, 17, 18, 40, 61], "contiguous", 4, "silu", True, 8, 1,
                              ("autograd",)),
    # zigzag: rank 0 holds the first and last parts (a document comes back to it)
    "w2_zigzag_k3": Case(2, [0, 17, 18, 40, 61], "zigzag", 3, None, False, 8, 2),
    # one token over two ranks: rank 0 is empty, nothing crosses (only the reduce gathers)
    "w2_empty_k2": Case(2, [0, 1], "contiguous", 2, "silu", True, 4, 3),
    # 1-token fragments alternating between the ranks: halos from both ranks and itself
    "w2_len1_k4": Case(2, [0, 12], [(0, 0, 0, 4), (1, 0, 4, 1), (0, 0, 5, 1), (1, 0, 6, 1),
                                    (0, 0, 7, 5)], 4, None, True, 8, 4, ("autograd", "bad")),
    # W = 3: one document over every rank
    "w3_contig_k4": Case(3, [0, 5, 40, 41, 50], "contiguous", 4, "silu", False, 8, 5),
    # zigzag: document 1 visits ranks 0, 1, 2, 1
    "w3_zigzag_k3": Case(3, [0, 5, 40, 41, 50], "zigzag", 3, None, True, 8, 6),
    # nine tokens, zigzag parts of 1-2 tokens: with W = 4 rank 0's last halo spans ranks
    # 2 and 1, rank 2's spans ranks 0 and 1
    "w3_short_k4": Case(3, [0, 9], "zigzag", 4, "silu", True, 8, 7, ("autograd",)),
    # two tokens over three ranks: rank 0 empty
    "w3_empty_k2": Case(3, [0, 2], "contiguous", 2, None, True, 4, 8),
    # W = 4: zigzag parts of 2-3 tokens: document 1 visits ranks 0, 1, 2, 3, 2, 1, 0 and
    # rank 2's first halo spans ranks 0 and 1
    "w4_zigzag_k4": Case(4, [0, 1, 17], "zigzag", 4, "silu", True, 8, 9),
    # contiguous: short documents on rank 0, one over ranks 0-3
    "w4_contig_k3": Case(4, [0, 3, 4, 5, 30], "contiguous", 3, "silu", False, 8, 11),
    # rank 1 empty; rank 0's second fragment's halo: rank 0 itself, rank 2, rank 3
    "w4_explicit_k4": Case(4, [0, 9, 14], [(0, 0, 0, 5), (2, 0, 5, 1), (3, 0, 6, 1),
                                           (0, 0, 7, 2), (3, 1, 0, 5)], 4, None, True, 8, 10),
}


def global_inputs(case: Case, device="cpu"):
    """The global fp32 inputs of a case (the tests build the same)."""
    from _conv_kcp_helpers import global_inputs as make

    return make(case.cu[-1], case.D, case.kernel_size, bias=case.bias, seed=case.seed,
                device=device)


def partition_of(case: Case):
    from cake_causal_conv1d_det_train_kcp import partition_det_kcp

    cu_t = torch.tensor(case.cu, dtype=torch.int64)
    if isinstance(case.layout, str):
        return partition_det_kcp(cu_t, case.world, case.layout)
    return partition_det_kcp(cu_t, case.world, fragments=case.layout)


NAMES = ("y", "dx", "dweight", "dbias")


def _device(rank):
    """Each rank's device: GPU ``rank`` when CUDA is there (NCCL), else the CPU (gloo)."""
    return torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")


def _same(a, b) -> bool:
    from cake_core.testing import bitwise_equal

    return all((x is None and y is None) or bitwise_equal(x, y) for x, y in zip(a, b,
                                                                                strict=True))


def _run(case: Case, rank: int):
    from _conv_kcp_helpers import autograd_run, kcp_run, shard
    from cake_causal_conv1d_det_train_kcp import build_context_det_kcp

    p = partition_of(case)
    dev = _device(rank)
    ctx = build_context_det_kcp(p, None, rank, dev, case.kernel_size)
    local = shard(global_inputs(case, dev), p, rank)
    act = case.activation

    with _count_calls() as calls:
        first = kcp_run(local, ctx, act)
    second = kcp_run(local, ctx, act)
    with _count_calls() as calls_red:
        red = kcp_run(local, ctx, act, reduce_weight_grads=True)
    out = {n: t for n, t in zip(NAMES, first, strict=True)}
    out["dweight_red"], out["dbias_red"] = red[2], red[3]
    out["calls"], out["calls_red"] = dict(calls), dict(calls_red)
    out["num_tokens"] = ctx.num_tokens
    out["repeat"] = _same(first, second)
    out["red_same_y_dx"] = _same(first[:2], red[:2])
    out["moved"], out["comm_bytes"] = zip(*(_moved_and_comm_bytes(ctx, local, case, red)
                                            for red in (False, True)), strict=True)
    if "autograd" in case.flags:
        out["autograd_same"] = _same(autograd_run(local, ctx, act), first)
        out["autograd_red_same"] = _same(autograd_run(local, ctx, act, True), red)
    if "bad" in case.flags:
        out["bad"] = _bad_inputs(p, ctx, local, rank, case)
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


def _moved_and_comm_bytes(ctx, local, case: Case, reduce: bool):
    """What the collectives of one more steady-state step move on this rank, and what
    ``comm_bytes`` says they move."""
    from cake_causal_conv1d_det_train_kcp import (
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
        comm_bytes,
    )

    x, w, b, dy = local
    with count_collective_bytes() as (moved, phase):
        _, saved = causal_conv1d_det_fwd_kcp(x, w, b, ctx, activation=case.activation)
        phase[0] = "bwd"
        causal_conv1d_det_bwd_kcp(dy, saved, ctx, reduce_weight_grads=reduce)
    want = comm_bytes(ctx, x.shape[-1], x.dtype, bias=b is not None, reduce_weight_grads=reduce)
    return dict(moved), {k: want[k] for k in moved}


@contextlib.contextmanager
def _count_calls():
    """Counts the single-rank calls the KCP entries make (``fwd`` / ``bwd``) and the
    all-gathers (``gather``)."""
    import cake_causal_conv1d_det_train_kcp.api as api
    import torch.distributed as dist

    calls = {"fwd": 0, "bwd": 0, "gather": 0}
    real = api.causal_conv1d_det_fwd, api.causal_conv1d_det_bwd, dist.all_gather

    def wrap(key, fn):
        def f(*a, **k):
            calls[key] += 1
            return fn(*a, **k)
        return f

    api.causal_conv1d_det_fwd = wrap("fwd", real[0])
    api.causal_conv1d_det_bwd = wrap("bwd", real[1])
    dist.all_gather = wrap("gather", real[2])
    try:
        yield calls
    finally:
        api.causal_conv1d_det_fwd, api.causal_conv1d_det_bwd, dist.all_gather = real


def _bad_inputs(p, ctx, local, rank, case):
    """Bad inputs on a live group: each must raise ValueError and run no collective.
    Returns the messages (a ``"NO ERROR: ..."`` entry when a call went through)."""
    from cake_causal_conv1d_det_train_kcp import (
        build_context_det_kcp,
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
        causal_conv1d_det_kcp,
        partition_det_kcp,
    )
    from cake_core.kcp import build_context
    from cake_core.testing import refusals_without_collectives

    W = case.world
    x, w, b, dy = local
    with refusals_without_collectives() as (expect, msgs):
        cu = torch.tensor(p.cu_seqlens)
        expect("partition for another world size",
               lambda: build_context_det_kcp(partition_det_kcp(cu, W + 1), None, rank,
                                             ctx.device, case.kernel_size))
        other = build_context(p, None, (rank + 1) % W, ctx.device, case.kernel_size,
                              check_group=False)
        expect("context from another rank", lambda: causal_conv1d_det_fwd_kcp(x, w, b, other))
        longer = torch.cat([x, x[:, :1]], dim=1)
        expect("length disagrees with ctx", lambda: causal_conv1d_det_fwd_kcp(longer, w, b, ctx))
        expect("bad dtype", lambda: causal_conv1d_det_fwd_kcp(x.double(), w, b, ctx))
        k3 = build_context_det_kcp(p, None, rank, ctx.device, case.kernel_size - 1)
        expect("context of another kernel size", lambda: causal_conv1d_det_fwd_kcp(x, w, b, k3))
        expect("autograd entry, reduce flag not a bool",
               lambda: causal_conv1d_det_kcp(x, w, b, ctx, reduce_weight_grads=1))
        _, saved = causal_conv1d_det_fwd_kcp(x, w, b, ctx)  # a good one (its collectives run)
        expect("backward with a context from another rank",
               lambda: causal_conv1d_det_bwd_kcp(dy, saved, other))
        expect("backward with dy of another length",
               lambda: causal_conv1d_det_bwd_kcp(torch.cat([dy, dy[:, :1]], 1), saved, ctx))
        expect("backward, reduce flag not a bool",
               lambda: causal_conv1d_det_bwd_kcp(dy, saved, ctx, reduce_weight_grads="yes"))
        # the good forward's backward, so every rank ran the same collectives
        causal_conv1d_det_bwd_kcp(dy, saved, ctx)
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
    # without CUDA: import the package (and Triton's interpreter) once, then fork the ranks
    # (each inherits the imports: seconds less per rank on a small CPU)
    method = "spawn"
    if not torch.cuda.is_available():
        import _conv_kcp_helpers  # noqa: F401
        import cake_causal_conv1d_det_train_kcp.api  # noqa: F401

        method = "fork"
    mp.start_processes(_rank_main, args=(W, outdir, names), nprocs=W, join=True,
                       start_method=method)
    print("ok")
