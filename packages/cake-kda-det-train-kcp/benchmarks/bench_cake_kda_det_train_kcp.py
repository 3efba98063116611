"""Benchmark the context-parallel det chunked Kimi Delta Attention (cake-kda-det-train-kcp).

    torchrun --nproc-per-node 2 benchmarks/bench_cake_kda_det_train_kcp.py \\
        --seqlen 65536 --docs 8 --boundary random --layout zigzag --exchange allgather \\
        --gate softplus --base local [--check] [--out result.json]
    python benchmarks/bench_cake_kda_det_train_kcp.py --world-size 2 --device cpu \\
        --seqlen 100 --docs 2 --boundary none --heads 1 --v-heads 1 --head-dim 16 --dtype fp32

Launch: under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set) every process joins the group
(NCCL on CUDA, one GPU per local rank; gloo on the CPU); otherwise the script spawns
``--world-size`` processes itself (``torch.multiprocessing``, gloo on the CPU, NCCL with
one GPU each on CUDA).

Documents: ``--seqlen`` T global tokens in ``--docs`` documents whose boundaries fall,
relative to the rank cuts of ``--layout`` (contiguous: ``floor(rT/W)``; zigzag: the 2W
part cuts), ``none``: away from every cut (each cut falls inside a document: the most
exchange), ``on``: on the cuts first (no document crosses a cut when docs > cuts), ``after``:
one token after each cut (1-token fragments), ``random``: anywhere (seeded). With ``T < W``
(e.g. ``--seqlen 1 --docs 1`` on two ranks) some ranks hold no token: they run no kernel
and still take part in every collective.

Inputs: q, k (L2-normalised), v, and per channel g (logsigmoid), beta (sigmoid); with
``--gate softplus`` / ``lower_bound`` FLA's in-kernel gate instead (raw g, A_log, dt_bias
for softplus, ``lower_bound=-5`` for the other, pre-sigmoid beta), the gate-parameter
gradients summed over the ranks (``--no-reduce-gate-grads``: each rank's share).

Per rank, the median wall time (all ranks start each repetition together after a
barrier; the host waits for the device) of the KCP forward (``chunk_kda_det_fwd_kcp``),
backward (``chunk_kda_det_bwd_kcp``) and both, and the bytes the exchange moves
(:func:`cake_kda_det_train_kcp.exchange_bytes`). ``--base local``: rank 0 also runs the
same documents (all T tokens) through the single-rank package (``chunk_kda_det_fwd`` /
``chunk_kda_det_bwd``) for comparison; the others wait. ``--check``: every rank compares
its outputs and gradients with the single-rank package's on its tokens (relative Frobenius
error; dA_log / ddt_bias when reduced) and repeats its KCP run to compare sha256 of the
bits. Rank 0 prints one JSON record (and writes it to ``--out``).
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
GRAD_NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: torchrun's WORLD_SIZE, else 2)")
    p.add_argument("--seqlen", type=int, default=65536, help="global tokens T")
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--boundary", choices=("none", "on", "after", "random"), default="random")
    p.add_argument("--layout", choices=("contiguous", "zigzag"), default="contiguous")
    p.add_argument("--exchange", choices=("allgather", "ring"), default="allgather")
    p.add_argument("--base", choices=("none", "local"), default="none")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--v-heads", type=int, default=32, help="value heads HV")
    p.add_argument("--head-dim", type=int, default=128, help="K = V")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm_in_kernel=True")
    p.add_argument("--gate", choices=("none", "softplus", "lower_bound"), default="none",
                   help="FLA's in-kernel gate (and beta sigmoid)")
    p.add_argument("--no-reduce-gate-grads", action="store_true",
                   help="reduce_gate_param_grads=False (each rank keeps its share)")
    p.add_argument("--warmup", type=int, default=None, help="default 2 on CUDA, 0 on CPU")
    p.add_argument("--reps", type=int, default=None, help="default 10 on CUDA, 1 on CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    for name in ("seqlen", "docs", "heads", "v_heads", "head_dim"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.docs > a.seqlen:
        p.error("--docs must be <= --seqlen (documents are non-empty)")
    if a.v_heads % a.heads:
        p.error("--v-heads must be a multiple of --heads")
    return a


# ----------------------------------------------------------------------------- documents


def rank_cuts(T: int, W: int, layout: str) -> list[int]:
    """The interior global positions where one rank's (or zigzag part's) tokens end."""
    parts = W if layout == "contiguous" else 2 * W
    return sorted({p * T // parts for p in range(1, parts)} - {0, T})


def make_cu(T: int, docs: int, boundary: str, layout: str, W: int, seed: int) -> list[int]:
    """Global offsets of ``docs`` non-empty documents over T tokens (module docstring)."""
    need = docs - 1
    if need == 0:
        return [0, T]
    free = set(range(1, T))
    cuts = rank_cuts(T, W, layout)
    if boundary == "random":
        chosen = set(random.Random(seed).sample(sorted(free), need))
        return [0, *sorted(chosen), T]
    preferred = {"on": cuts, "after": [c + 1 for c in cuts if c + 1 < T]}.get(boundary, [])
    preferred = sorted(set(preferred))
    if len(preferred) > need:  # an even subset of the preferred positions
        preferred = [preferred[(i * len(preferred)) // need] for i in range(need)]
    chosen = set(preferred)
    avoid = set(cuts) | {c + 1 for c in cuts} if boundary == "none" else set(cuts)
    for i in range(1, docs):  # the rest evenly spaced, off the cuts where possible
        if len(chosen) == need:
            break
        pos = i * T // docs
        best = min(free - chosen, key=lambda x: (x in avoid, abs(x - pos), x))
        chosen.add(best)
    return [0, *sorted(chosen), T]


# ----------------------------------------------------------------------------- inputs


def global_inputs(T, H, HV, K, dtype, device, seed, gate):
    """``(xs, kw)``: xs = q, k (L2-normalised), v, g, beta, do, the same in every process
    (a seeded generator on ``device``); kw the gate options with A_log / dt_bias."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    q = rn(1, T, H, K).to(dtype)
    k = torch.nn.functional.normalize(rn(1, T, H, K), dim=-1).to(dtype)
    v = rn(1, T, HV, K).to(dtype)
    x = rn(1, T, HV, K)
    b = rn(1, T, HV)
    do = rn(1, T, HV, K).to(dtype)
    kw = {}
    if gate == "none":
        g, beta = torch.nn.functional.logsigmoid(x), torch.sigmoid(b)
    else:
        g, beta = 1.5 * x, 2.0 * b
        kw = {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True,
              "A_log": 0.5 * rn(HV) - 0.5}
        if gate == "softplus":
            kw["dt_bias"] = 0.5 * rn(HV * K)
        else:
            kw["lower_bound"] = -5.0
    return [q, k, v, g, beta, do], kw


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
    from cake_core.testing import rel_fro_error
    from cake_kda_det_train import chunk_kda_det_bwd, chunk_kda_det_fwd
    from cake_kda_det_train_kcp import (
        build_context_det_kcp,
        chunk_kda_det_bwd_kcp,
        chunk_kda_det_fwd_kcp,
        exchange_bytes,
        partition_det_kcp,
    )
    from cake_kda_det_train_kcp.context import gate_grad_width

    T, H, HV, K = a.seqlen, a.heads, a.v_heads, a.head_dim
    dtype = DTYPES[a.dtype]
    cu = make_cu(T, a.docs, a.boundary, a.layout, W, a.seed)
    part = partition_det_kcp(torch.tensor(cu, dtype=torch.int64), W, a.layout)
    ctx = build_context_det_kcp(part, None, rank, device, exchange=a.exchange)
    idx = part.global_index(rank).to(device)
    glob, kw = global_inputs(T, H, HV, K, dtype, device, a.seed, a.gate)
    local = [t[:, idx].contiguous() for t in glob]
    if not (a.base == "local" and rank == 0) and not a.check:
        del glob
    kw["use_qk_l2norm_in_kernel"] = a.l2norm
    reduce = not a.no_reduce_gate_grads
    warmup = a.warmup if a.warmup is not None else (2 if device.type == "cuda" else 0)
    reps = a.reps if a.reps is not None else (10 if device.type == "cuda" else 1)

    def fwd():
        return chunk_kda_det_fwd_kcp(*local[:5], ctx, reduce_gate_param_grads=reduce, **kw)

    def step():
        o, saved = fwd()
        return (o, *chunk_kda_det_bwd_kcp(local[5], saved, ctx))

    gate_floats = 0
    if a.gate != "none" and reduce:
        gate_floats = gate_grad_width(HV, K, True, a.gate == "softplus")
    rec = {"rank": rank, "tokens": ctx.num_tokens, "fragments": ctx.num_fragments,
           "recv": len(ctx.recv), "send": len(ctx.send),
           "middle": sum(1 for f in ctx.fragments if f.has_prev and f.has_next),
           "bytes": exchange_bytes(ctx, K, K, HV, gate_grad_floats=gate_floats)}
    t0 = time.perf_counter()
    first = step()
    _sync(device)
    rec["first_call_s"] = time.perf_counter() - t0
    rec["fwd"] = timed(fwd, device, warmup, reps)
    _, saved = fwd()
    rec["bwd"] = timed(lambda: chunk_kda_det_bwd_kcp(local[5], saved, ctx), device, warmup,
                       reps)
    rec["fwd_bwd"] = timed(step, device, warmup, reps)
    saved = None  # noqa: F841 - frees the saved set before the checks
    if a.check:
        again = step()
        rec["hash"] = sha(first)
        rec["repeat_bitwise"] = rec["hash"] == sha(again)
        o, _, s = chunk_kda_det_fwd(*glob[:5], **kw,
                                    cu_seqlens=torch.tensor(cu, dtype=torch.int64, device=device))
        gr = chunk_kda_det_bwd(glob[5], None, s)
        ref = (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, gr.dA_log, gr.ddt_bias)
        rec["rel_err"] = {}
        for n, x, r in zip(GRAD_NAMES, first, ref, strict=True):
            if x is None or (n in ("dA_log", "ddt_bias") and not reduce):
                continue  # absent, or this rank's share only
            if x.dim() > 1:
                r = r[:, idx]
            rec["rel_err"][n] = rel_fro_error(x, r) if x.numel() else 0.0
        del o, s, gr, ref
    del first
    dist.barrier()
    if a.base == "local":
        if rank == 0:
            cu_dev = torch.tensor(cu, dtype=torch.int64, device=device)

            def lfwd():
                return chunk_kda_det_fwd(*glob[:5], cu_seqlens=cu_dev, **kw)

            def lstep():
                o, _, s = lfwd()
                return chunk_kda_det_bwd(glob[5], None, s)

            lstep()
            _, _, s = lfwd()
            rec["local"] = {"fwd": timed(lfwd, device, warmup, reps, group=False),
                            "bwd": timed(lambda: chunk_kda_det_bwd(glob[5], None, s), device,
                                         warmup, reps, group=False),
                            "fwd_bwd": timed(lstep, device, warmup, reps, group=False)}
        dist.barrier()
    return rec


def summary(a, W, device, recs) -> dict:
    from cake_core.bench import device_description, utc_now

    cu = make_cu(a.seqlen, a.docs, a.boundary, a.layout, W, a.seed)
    out = {"when": utc_now(), "torch": torch.__version__,
           "device": device_description(device.type), "backend": dist.get_backend(),
           "world_size": W, "seqlen": a.seqlen, "docs": a.docs, "cu_seqlens": cu
           if len(cu) <= 64 else f"{len(cu) - 1} documents", "boundary": a.boundary,
           "layout": a.layout, "exchange": a.exchange, "H": a.heads, "HV": a.v_heads,
           "K": a.head_dim, "V": a.head_dim, "dtype": a.dtype, "l2norm": a.l2norm,
           "gate": a.gate, "reduce_gate_param_grads": not a.no_reduce_gate_grads,
           "ranks": recs}
    kcp = max(r["fwd_bwd"]["ms"] for r in recs)
    out["kcp_fwd_bwd_ms_slowest_rank"] = kcp
    local = recs[0].get("local")
    if local:
        out["local_fwd_bwd_ms"] = local["fwd_bwd"]["ms"]
        out["speedup_vs_local"] = local["fwd_bwd"]["ms"] / kcp if kcp else None
    if a.check:
        out["repeat_bitwise_all_ranks"] = all(r["repeat_bitwise"] for r in recs)
        out["max_rel_err"] = max(max(r["rel_err"].values(), default=0.0) for r in recs)
    return out


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
    dist.barrier()  # every rank leaves together (gloo aborts a rank whose peer tore down first)


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

    mp.spawn(_worker, args=(W, a, f"tcp://127.0.0.1:{_free_port()}", use_cuda), nprocs=W,
             join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
