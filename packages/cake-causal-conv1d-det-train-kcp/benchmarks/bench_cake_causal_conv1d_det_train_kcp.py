"""Benchmark the context-parallel det causal depthwise conv1d (cake-causal-conv1d-det-train-kcp).

    torchrun --nproc-per-node 2 benchmarks/bench_cake_causal_conv1d_det_train_kcp.py \\
        --seqlen 65536 --docs 8 --boundary random --layout zigzag --hidden 4096 \\
        --kernel-size 4 --base local [--reduce-weight-grads] [--check] [--out result.json]
    python benchmarks/bench_cake_causal_conv1d_det_train_kcp.py --world-size 2 --device cpu \\
        --seqlen 64 --docs 3 --hidden 8 --dtype fp32 --base local --check

Launch: under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set) every process joins the group
(NCCL on CUDA, one GPU per local rank; gloo on the CPU); otherwise the script starts
``--world-size`` processes itself (``torch.multiprocessing``: forked after importing the
package, gloo, on the CPU; spawned, NCCL with one GPU each, on CUDA).

Documents: ``--seqlen`` T global tokens in ``--docs`` non-empty documents whose boundaries
fall, relative to the rank cuts of ``--layout`` (contiguous: ``floor(rT/W)``; zigzag: the
2W part cuts), ``none``: away from every cut (each cut falls inside a document: every cut
moves a halo), ``on``: on the cuts first (no halo crosses them when docs > cuts),
``after``: one token after each cut (1-token fragments: a halo spans two ranks), or
``random``: anywhere (seeded). With ``T < W`` some ranks hold no token: they run no kernel
and still take part in every collective.

Per rank, the median wall time (all ranks start each repetition together after a barrier;
the host waits for the device) of the KCP forward (``causal_conv1d_det_fwd_kcp``), backward
(``causal_conv1d_det_bwd_kcp``) and both, and the bytes the collectives move
(:func:`cake_causal_conv1d_det_train_kcp.exchange_bytes`). ``--base local``: rank 0 also
runs the same documents (all T tokens) through the single-rank package
(``causal_conv1d_det_fwd`` / ``causal_conv1d_det_bwd``); the others wait. ``--check``:
every rank compares y and dx on its tokens, and the reduced dweight / dbias, with the
single-rank package's (relative Frobenius error), and repeats its KCP run to compare sha256
of the bits. Rank 0 prints one JSON record (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import socket
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: torchrun's WORLD_SIZE, else 2)")
    p.add_argument("--seqlen", type=int, default=65536, help="global tokens T")
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--boundary", choices=("none", "on", "after", "random"), default="random")
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    p.add_argument("--base", choices=("none", "local"), default="none")
    p.add_argument("--hidden", type=int, default=4096, help="channels D")
    p.add_argument("--kernel-size", type=int, default=4, help="taps W (2..8)")
    p.add_argument("--activation", choices=("none", "silu"), default="silu")
    p.add_argument("--bias", action="store_true")
    p.add_argument("--reduce-weight-grads", action="store_true",
                   help="sum dweight / dbias over the ranks (all-gather, rank order)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--warmup", type=int, default=None, help="default 3 on CUDA, 0 on CPU")
    p.add_argument("--reps", type=int, default=None, help="default 20 on CUDA, 1 on CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    for name in ("seqlen", "docs", "hidden"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if not 2 <= a.kernel_size <= 8:
        p.error("--kernel-size must be in [2, 8]")
    if a.docs > a.seqlen:
        p.error("--docs must be <= --seqlen (documents are non-empty)")
    return a


# ----------------------------------------------------------------------------- documents


def rank_cuts(T: int, W: int, layout: str) -> list[int]:
    """The interior global positions where one rank's (or zigzag part's) tokens end."""
    parts = W if layout == "contiguous" else 2 * W
    return sorted({q * T // parts for q in range(1, parts)} - {0, T})


def make_cu(T: int, docs: int, boundary: str, layout: str, W: int, seed: int) -> list[int]:
    """Global offsets of ``docs`` non-empty documents over T tokens (module docstring)."""
    need = docs - 1
    if need == 0:
        return [0, T]
    inner = list(range(1, T))
    cuts = rank_cuts(T, W, layout)
    if boundary == "random":
        return [0, *sorted(random.Random(seed).sample(inner, need)), T]
    prefer = {"on": cuts, "after": [c + 1 for c in cuts if c + 1 < T], "none": []}[boundary]
    prefer = sorted(set(prefer))
    if len(prefer) > need:  # an even subset of the preferred positions
        prefer = [prefer[(i * len(prefer)) // need] for i in range(need)]
    chosen = set(prefer)
    avoid = set(cuts) | ({c + 1 for c in cuts} if boundary == "none" else set())
    for i in range(1, docs):  # the rest near even spacing, off the cuts where possible
        if len(chosen) == need:
            break
        target = i * T // docs
        best = min((x for x in inner if x not in chosen),
                   key=lambda x: (x in avoid, abs(x - target), x))
        chosen.add(best)
    return [0, *sorted(chosen), T]


# ----------------------------------------------------------------------------- inputs


def global_inputs(T, D, W, dtype, device, seed, bias):
    """x, weight (scaled 0.5), bias (or None), dy: the same in every process (a seeded
    generator on ``device``)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    x, w = rn(1, T, D), rn(D, W, scale=0.5)
    b = rn(D) if bias else None
    return x, w, b, rn(1, T, D)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, warmup, reps, group=True):
    """Median / p20 / p80 wall ms of ``fn`` (a barrier before each run when ``group``)."""
    from cake_core.bench import summarize_ms

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if group:
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize_ms(times)


def sha(tensors):
    from cake_core.bench import bits_sha256

    return bits_sha256(tensors)[:16]


# ----------------------------------------------------------------------------- one rank


def run_rank(rank: int, W: int, a, device: torch.device) -> dict:
    from cake_causal_conv1d_det_train import causal_conv1d_det_bwd, causal_conv1d_det_fwd
    from cake_causal_conv1d_det_train_kcp import (
        build_context_det_kcp,
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
        exchange_bytes,
        partition_det_kcp,
    )
    from cake_core.testing import rel_fro_error

    T, D, K = a.seqlen, a.hidden, a.kernel_size
    dtype = DTYPES[a.dtype]
    act = None if a.activation == "none" else "silu"
    red = a.reduce_weight_grads
    cu = make_cu(T, a.docs, a.boundary, a.layout, W, a.seed)
    part = partition_det_kcp(torch.tensor(cu, dtype=torch.int64), W, a.layout)
    ctx = build_context_det_kcp(part, None, rank, device, K)
    idx = part.global_index(rank).to(device)
    gx, gw, gb, gdy = global_inputs(T, D, K, dtype, device, a.seed, a.bias)
    x, dy = gx[:, idx].contiguous(), gdy[:, idx].contiguous()
    keep_global = (a.base == "local" and rank == 0) or a.check
    if not keep_global:
        del gx, gdy
    warmup = a.warmup if a.warmup is not None else (3 if device.type == "cuda" else 0)
    reps = a.reps if a.reps is not None else (20 if device.type == "cuda" else 1)

    def fwd():
        return causal_conv1d_det_fwd_kcp(x, gw, gb, ctx, activation=act)

    def step(reduce=red):
        y, saved = fwd()
        g = causal_conv1d_det_bwd_kcp(dy, saved, ctx, reduce_weight_grads=reduce)
        return (y, *g)

    rec = {"rank": rank, "tokens": ctx.num_tokens, "fragments": ctx.num_fragments,
           "halo_fragments": len(ctx.halo),
           "bytes": exchange_bytes(ctx, D, dtype, bias=a.bias, reduce_weight_grads=red)}
    t0 = time.perf_counter()
    first = step()
    _sync(device)
    rec["first_call_s"] = time.perf_counter() - t0
    rec["fwd"] = timed(fwd, device, warmup, reps)
    _, saved = fwd()
    rec["bwd"] = timed(lambda: causal_conv1d_det_bwd_kcp(dy, saved, ctx,
                                                         reduce_weight_grads=red),
                       device, warmup, reps)
    rec["fwd_bwd"] = timed(step, device, warmup, reps)
    saved = None  # noqa: F841 - frees the saved set before the checks
    if a.check:
        again = step()
        rec["hash"] = sha(first)
        rec["repeat_bitwise"] = rec["hash"] == sha(again)
        reduced = step(True)  # the full dweight / dbias on every rank
        cu_dev = torch.tensor(cu, dtype=torch.int64, device=device)
        y, _, s = causal_conv1d_det_fwd(gx, gw, gb, activation=act, cu_seqlens=cu_dev)
        g = causal_conv1d_det_bwd(gdy, None, s)
        err = {"y": (first[0], y[:, idx]), "dx": (first[1], g.dx[:, idx]),
               "dweight": (reduced[2], g.dweight), "dbias": (reduced[3], g.dbias)}
        rec["rel_err"] = {n: (rel_fro_error(u.float(), v.float()) if u is not None and u.numel()
                              else 0.0) for n, (u, v) in err.items()}
        rec["reduced_hash"] = sha(reduced[2:])
        del y, s, g, reduced, again
    del first
    dist.barrier()
    if a.base == "local":
        if rank == 0:
            cu_dev = torch.tensor(cu, dtype=torch.int64, device=device)

            def lfwd():
                return causal_conv1d_det_fwd(gx, gw, gb, activation=act, cu_seqlens=cu_dev)

            def lstep():
                _, _, s = lfwd()
                return causal_conv1d_det_bwd(gdy, None, s)

            lstep()
            _, _, s = lfwd()
            rec["local"] = {"fwd": timed(lfwd, device, warmup, reps, group=False),
                            "bwd": timed(lambda: causal_conv1d_det_bwd(gdy, None, s), device,
                                         warmup, reps, group=False),
                            "fwd_bwd": timed(lstep, device, warmup, reps, group=False)}
        dist.barrier()
    return rec


def summary(a, W, device, recs) -> dict:
    from cake_core.bench import device_description, utc_now

    cu = make_cu(a.seqlen, a.docs, a.boundary, a.layout, W, a.seed)
    out = {"when": utc_now(), "torch": torch.__version__,
           "device": device_description(device.type), "backend": dist.get_backend(),
           "world_size": W, "seqlen": a.seqlen, "docs": a.docs,
           "cu_seqlens": cu if len(cu) <= 64 else f"{len(cu) - 1} documents",
           "boundary": a.boundary, "layout": a.layout, "D": a.hidden, "W": a.kernel_size,
           "activation": a.activation, "bias": a.bias,
           "reduce_weight_grads": a.reduce_weight_grads, "dtype": a.dtype, "ranks": recs}
    kcp = max(r["fwd_bwd"]["ms"] for r in recs)
    out["kcp_fwd_bwd_ms_slowest_rank"] = kcp
    local = recs[0].get("local")
    if local:
        out["local_fwd_bwd_ms"] = local["fwd_bwd"]["ms"]
        out["speedup_vs_local"] = local["fwd_bwd"]["ms"] / kcp if kcp else None
    if a.check:
        out["repeat_bitwise_all_ranks"] = all(r["repeat_bitwise"] for r in recs)
        out["reduced_same_bits_all_ranks"] = len({r["reduced_hash"] for r in recs}) == 1
        out["max_rel_err"] = max(max(r["rel_err"].values()) for r in recs)
    return out


def _main_rank(rank, W, a, device):
    rec = run_rank(rank, W, a, device)
    recs = [None] * W
    dist.all_gather_object(recs, rec)
    if rank == 0:
        out = summary(a, W, device, recs)
        print(json.dumps(out, indent=1, default=str), flush=True)
        if a.out:
            from cake_core.bench import write_json

            write_json(a.out, out)
    dist.barrier()  # every rank leaves together (gloo can abort a rank that tears down first)


def _worker(rank: int, W: int, a, init: str, use_cuda: bool) -> None:
    if use_cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=init, rank=rank,
                            world_size=W, timeout=datetime.timedelta(minutes=30))
    try:
        device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
        _main_rank(rank, W, a, device)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = parse_args(argv)
    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    if a.device == "cpu" and torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # run the kernels on the CPU
    if use_cuda and not torch.cuda.is_available():
        print("CUDA is not available; use --device cpu", file=sys.stderr)
        return 2
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        W, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if a.world_size not in (None, W):
            print(f"--world-size {a.world_size} but torchrun started {W}", file=sys.stderr)
            return 2
        local = int(os.environ.get("LOCAL_RANK", rank))
        if use_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(minutes=30))
        try:
            _main_rank(rank, W, a, torch.device("cuda", local) if use_cuda
                       else torch.device("cpu"))
        finally:
            dist.destroy_process_group()
        return 0
    W = a.world_size or 2
    if use_cuda and torch.cuda.device_count() < W:
        print(f"--world-size {W} needs {W} GPUs (found {torch.cuda.device_count()}); use "
              "--device cpu", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    method = "spawn"
    if not use_cuda:  # import once, fork the ranks: each inherits the imports (a small CPU
        import cake_causal_conv1d_det_train_kcp.api  # noqa: F401 - spends seconds on each)

        method = "fork"
    mp.start_processes(_worker, args=(W, a, f"tcp://127.0.0.1:{_free_port()}", use_cuda),
                       nprocs=W, join=True, start_method=method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
