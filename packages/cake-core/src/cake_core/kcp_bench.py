"""The harness the context-parallel (``-kcp``) benchmarks share: documents, launch, timing.

Used by ``packages/cake-*-kcp/benchmarks/bench_*.py`` (run from source, ``PYTHONPATH`` over
``packages/*/src``), never by kernels or entry points. Plain Python and torch
(``torch.distributed``); each benchmark keeps its own inputs, its per-rank run and its
family's fields of the record, and hands them to :func:`main`.

Launch: under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set) every process joins the group
(NCCL on CUDA, one GPU per local rank; gloo on the CPU); otherwise :func:`main` starts
``--world-size`` processes itself (``torch.multiprocessing``: spawned, NCCL with one GPU
each, on CUDA; on the CPU gloo, spawned, or forked after importing ``cpu_fork_import``).

Documents (:func:`make_cu`): T global tokens in ``docs`` non-empty documents whose
boundaries fall, relative to the rank cuts of the layout (:func:`rank_cuts`; contiguous:
``floor(rT/W)``; zigzag: the 2W part cuts), ``none``: away from every cut (each cut falls
inside a document), ``on``: on the cuts first, ``after``: one token after each cut
(1-token fragments), ``random``: anywhere (seeded).

Timing (:func:`timed`): milliseconds, the median / p20 / p80 of
:func:`cake_core.bench.summarize_ms`, a group barrier before each repetition and the host
waiting for the device around it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ----------------------------------------------------------------------------- arguments


def add_document_args(p: argparse.ArgumentParser) -> None:
    """``--world-size``, ``--seqlen``, ``--docs``, ``--boundary``, ``--layout``."""
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: torchrun's WORLD_SIZE, else 2)")
    p.add_argument("--seqlen", type=int, default=65536, help="global tokens T")
    p.add_argument("--docs", type=int, default=8)
    p.add_argument("--boundary", choices=("none", "on", "after", "random"), default="random")
    p.add_argument("--layout", choices=("contiguous", "zigzag", "zigzag_per_document"),
                   default="contiguous")


def add_run_args(p: argparse.ArgumentParser, *, cuda_warmup: int, cuda_reps: int,
                 extra: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """``--dtype``, ``--device``, (``extra(p)``), ``--warmup``, ``--reps``, ``--seed``,
    ``--check``, ``--out``; warmup / reps default to ``cuda_warmup`` / ``cuda_reps`` on CUDA
    and 0 / 1 on the CPU (:func:`warmup_reps`)."""
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    if extra is not None:
        extra(p)
    p.add_argument("--warmup", type=int, default=None,
                   help=f"default {cuda_warmup} on CUDA, 0 on CPU")
    p.add_argument("--reps", type=int, default=None, help=f"default {cuda_reps} on CUDA, 1 on CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default="")


def check_positive(p: argparse.ArgumentParser, a: argparse.Namespace,
                   names: Iterable[str]) -> None:
    """``p.error("--<name> must be >= 1")`` for the first of ``names`` below 1."""
    for name in names:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def check_docs(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """``p.error("--docs must be <= --seqlen (documents are non-empty)")`` when it is not."""
    if a.docs > a.seqlen:
        p.error("--docs must be <= --seqlen (documents are non-empty)")


def warmup_reps(a: argparse.Namespace, device: torch.device, cuda_warmup: int,
                cuda_reps: int) -> tuple[int, int]:
    """``(warmup, reps)``: the arguments, else ``cuda_warmup`` / ``cuda_reps`` on CUDA and
    0 / 1 elsewhere."""
    cuda = device.type == "cuda"
    warmup = a.warmup if a.warmup is not None else (cuda_warmup if cuda else 0)
    reps = a.reps if a.reps is not None else (cuda_reps if cuda else 1)
    return warmup, reps


# ----------------------------------------------------------------------------- documents


def rank_cuts(T: int, W: int, layout: str) -> list[int]:
    """The interior global positions where one rank's (or zigzag part's) tokens end."""
    parts = W if layout == "contiguous" else 2 * W
    return sorted({q * T // parts for q in range(1, parts)} - {0, T})


def make_cu(T: int, docs: int, boundary: str, layout: str, W: int, seed: int) -> list[int]:
    """Global offsets of ``docs`` non-empty documents over T tokens (module docstring):
    ``[0, ..., T]``; ``random`` draws ``docs - 1`` of the positions ``1 .. T-1`` with
    ``random.Random(seed)``, the others take the preferred positions first (an even subset
    when there are more), then the free position nearest ``i * T // docs`` for each next
    document, off the cuts (and, for ``none``, the positions just after them) where
    possible."""
    need = docs - 1
    if need == 0:
        return [0, T]
    inner = list(range(1, T))
    cuts = rank_cuts(T, W, layout)
    if boundary == "random":
        return [0, *sorted(random.Random(seed).sample(inner, need)), T]
    prefer = {"on": cuts, "after": [c + 1 for c in cuts if c + 1 < T]}.get(boundary, [])
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


# ----------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    """Wait for ``device`` (CUDA); nothing elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int,
          group: bool = True) -> dict[str, float]:
    """Median / p20 / p80 wall ms of ``fn`` (a barrier before each run when ``group``)."""
    from cake_core.bench import summarize_ms

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if group:
            dist.barrier()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize_ms(times)


def sha(tensors: Iterable[torch.Tensor | None]) -> str:
    """The first 16 hex digits of :func:`cake_core.bench.bits_sha256`."""
    from cake_core.bench import bits_sha256

    return bits_sha256(tensors)[:16]


# ----------------------------------------------------------------------------- record


def summary(a: argparse.Namespace, W: int, device: torch.device, recs: Sequence[dict],
            fields: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's record: when, versions, device, backend, the documents, ``fields`` (the
    family's), ``ranks`` (``recs``), the slowest rank's KCP fwd+bwd ms, with ``--base local``
    the single-rank ms and the speedup, with ``--check`` whether every rank repeated
    bitwise and the largest relative error."""
    from cake_core.bench import device_description, utc_now

    cu = make_cu(a.seqlen, a.docs, a.boundary, a.layout, W, a.seed)
    out = {"when": utc_now(), "torch": torch.__version__,
           "device": device_description(device.type), "backend": dist.get_backend(),
           "world_size": W, "seqlen": a.seqlen, "docs": a.docs,
           "cu_seqlens": cu if len(cu) <= 64 else f"{len(cu) - 1} documents",
           "boundary": a.boundary, "layout": a.layout, **fields, "ranks": list(recs)}
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


# ----------------------------------------------------------------------------- launch

RunRank = Callable[[int, int, argparse.Namespace, torch.device], dict]
Summarize = Callable[[argparse.Namespace, int, torch.device, list], dict]


def main_rank(rank: int, W: int, a: argparse.Namespace, device: torch.device,
              run_rank: RunRank, summarize: Summarize) -> None:
    """``run_rank`` on this rank, all-gather the records; rank 0 prints
    ``summarize(a, W, device, recs)`` as JSON (and writes it to ``--out``)."""
    rec = run_rank(rank, W, a, device)
    recs = [None] * W
    dist.all_gather_object(recs, rec)
    if rank == 0:
        out = summarize(a, W, device, recs)
        print(json.dumps(out, indent=1, default=str), flush=True)
        if a.out:
            from cake_core.bench import write_json

            write_json(a.out, out)
    dist.barrier()  # every rank leaves together (gloo can abort a rank that tears down first)


def _worker(rank: int, W: int, a: argparse.Namespace, init: str, use_cuda: bool,
            run_rank: RunRank, summarize: Summarize) -> None:
    if use_cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=init, rank=rank,
                            world_size=W, timeout=datetime.timedelta(minutes=30))
    try:
        device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
        main_rank(rank, W, a, device, run_rank, summarize)
    except BaseException:
        dist.destroy_process_group()
        raise
    if use_cuda:
        dist.destroy_process_group()
        return
    # gloo: tearing the group down can still abort a rank whose peer closed its sockets
    # first ("terminate called without an active exception", seen once in a CI run after
    # the final barrier); every rank has finished and rank 0 has written its output, so
    # leave without the group's destructors
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(a: argparse.Namespace, run_rank: RunRank, summarize: Summarize, *,
         cpu_fork_import: str | None = None) -> int:
    """Run the benchmark (module docstring: launch) and return the exit status: 2 (with a
    message on stderr) when CUDA is asked for and missing, torchrun's world size differs
    from ``--world-size`` or there are fewer GPUs than ranks, else 0. ``--device cpu`` on a
    CUDA machine sets ``TRITON_INTERPRET=1`` (unless set). ``run_rank`` and ``summarize``
    must be picklable (module-level functions) for the spawned ranks."""
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
            main_rank(rank, W, a, torch.device("cuda", local) if use_cuda
                      else torch.device("cpu"), run_rank, summarize)
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
    if not use_cuda and cpu_fork_import:  # import once, fork the ranks: each inherits the
        importlib.import_module(cpu_fork_import)  # imports (a small CPU run spends seconds)
        method = "fork"
    mp.start_processes(_worker, args=(W, a, f"tcp://127.0.0.1:{free_port()}", use_cuda,
                                      run_rank, summarize),
                       nprocs=W, join=True, start_method=method)
    return 0


# ----------------------------------------------------------------------------- nondet / det

_BENCHES: dict[str, Any] = {}


def load_bench(path: str):
    """The benchmark script at ``path`` as a module (loaded once per process)."""
    if path not in _BENCHES:
        import importlib.util

        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _BENCHES[path] = mod
    return _BENCHES[path]


def nondet_run_rank(det_bench: str, api: dict, rank: int, W: int, a: argparse.Namespace,
                    device: torch.device) -> dict:
    """A nondet KCP package's record: the det benchmark at ``det_bench`` run through the
    nondet entries ``api`` (its ``run_rank(..., api=)``), then the det entries on the same
    inputs under ``det_kcp``. Bind the first two with ``functools.partial``."""
    det = load_bench(det_bench)
    rec = det.run_rank(rank, W, a, device, api=api)
    plain = argparse.Namespace(**{**vars(a), "base": "none", "check": False})
    rec["det_kcp"] = {k: v for k, v in det.run_rank(rank, W, plain, device).items()
                      if k in ("fwd", "bwd", "fwd_bwd")}
    return rec


def nondet_summary(det_bench: str, a: argparse.Namespace, W: int, device: torch.device,
                   recs: Sequence[dict]) -> dict:
    """The det benchmark's summary plus the slowest rank's det KCP fwd+bwd ms and
    ``ratio_nondet_over_det`` (below 1: nondet faster)."""
    out = load_bench(det_bench).summary(a, W, device, recs)
    det_ms = max(r["det_kcp"]["fwd_bwd"]["ms"] for r in recs)
    out["det_kcp_fwd_bwd_ms_slowest_rank"] = det_ms
    out["ratio_nondet_over_det"] = out["kcp_fwd_bwd_ms_slowest_rank"] / det_ms if det_ms else None
    return out
