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
(:func:`cake_causal_conv1d_det_train_kcp.comm_bytes`). ``--base local``: rank 0 also
runs the same documents (all T tokens) through the single-rank package
(``causal_conv1d_det_fwd`` / ``causal_conv1d_det_bwd``); the others wait. ``--check``:
every rank compares y and dx on its tokens, and the reduced dweight / dbias, with the
single-rank package's (relative Frobenius error), and repeats its KCP run to compare sha256
of the bits. Rank 0 prints one JSON record (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist
from cake_core import kcp_bench
from cake_core.kcp_bench import (
    DTYPES,
    make_cu,
    sha,
    timed,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kcp_bench.add_document_args(p)
    p.add_argument("--base", choices=("none", "local"), default="none")
    p.add_argument("--hidden", type=int, default=4096, help="channels D")
    p.add_argument("--kernel-size", type=int, default=4, help="taps W (2..8)")
    p.add_argument("--activation", choices=("none", "silu"), default="silu")
    p.add_argument("--bias", action="store_true")
    p.add_argument("--reduce-weight-grads", action="store_true",
                   help="sum dweight / dbias over the ranks (all-gather, rank order)")
    kcp_bench.add_run_args(p, cuda_warmup=3, cuda_reps=20)
    a = p.parse_args(argv)
    kcp_bench.check_positive(p, a, ("seqlen", "docs", "hidden"))
    if not 2 <= a.kernel_size <= 8:
        p.error("--kernel-size must be in [2, 8]")
    kcp_bench.check_docs(p, a)
    return a


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


# ----------------------------------------------------------------------------- one rank


def run_rank(rank: int, W: int, a, device: torch.device) -> dict:
    from cake_causal_conv1d_det_train import causal_conv1d_det_bwd, causal_conv1d_det_fwd
    from cake_causal_conv1d_det_train_kcp import (
        build_context_det_kcp,
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
        comm_bytes,
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
    warmup, reps = kcp_bench.warmup_reps(a, device, 3, 20)

    def fwd():
        return causal_conv1d_det_fwd_kcp(x, gw, gb, ctx, activation=act)

    def step(reduce=red):
        y, saved = fwd()
        g = causal_conv1d_det_bwd_kcp(dy, saved, ctx, reduce_weight_grads=reduce)
        return (y, *g)

    rec = {"rank": rank, "tokens": ctx.num_tokens, "fragments": ctx.num_fragments,
           "halo_fragments": len(ctx.halo),
           "bytes": comm_bytes(ctx, D, dtype, bias=a.bias, reduce_weight_grads=red)}
    t0 = time.perf_counter()
    first = step()
    kcp_bench.sync(device)
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
    out = kcp_bench.summary(a, W, device, recs, {
        "D": a.hidden, "W": a.kernel_size, "activation": a.activation, "bias": a.bias,
        "reduce_weight_grads": a.reduce_weight_grads, "dtype": a.dtype})
    if a.check:
        out["reduced_same_bits_all_ranks"] = len({r["reduced_hash"] for r in recs}) == 1
    return out


def main(argv=None) -> int:
    # on the CPU: import once, fork the ranks (each inherits the imports)
    return kcp_bench.main(parse_args(argv), run_rank, summary,
                          cpu_fork_import="cake_causal_conv1d_det_train_kcp.api")


if __name__ == "__main__":
    sys.exit(main())
