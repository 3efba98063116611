"""Benchmark the context-parallel det chunked Gated DeltaNet (cake-gdn-det-train-kcp).

    torchrun --nproc-per-node 2 benchmarks/bench_cake_gdn_det_train_kcp.py \\
        --seqlen 65536 --docs 8 --boundary random --layout zigzag --exchange allgather \\
        --base local [--check] [--out result.json]
    python benchmarks/bench_cake_gdn_det_train_kcp.py --world-size 2 --device cpu \\
        --seqlen 300 --docs 3 --heads 1 --v-heads 1 --head-dim 16 --dtype fp32 --reps 1

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

Per rank, the median wall time (all ranks start each repetition together after a
barrier; the host waits for the device) of the KCP forward (``chunk_gdn_det_fwd_kcp``),
backward (``chunk_gdn_det_bwd_kcp``) and both, and the bytes the exchange moves
(:func:`cake_gdn_det_train_kcp.comm_bytes`). ``--base local``: rank 0 also runs the
same documents (all T tokens) through the single-rank package (``chunk_gdn_det_fwd`` /
``chunk_gdn_det_bwd``) for comparison; the others wait. ``--check``: every rank compares its
outputs and gradients with the single-rank package's on its tokens (relative Frobenius
error) and repeats its KCP run to compare sha256 of the bits. Rank 0 prints one JSON
record (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import importlib
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
    p.add_argument("--exchange", choices=("allgather", "ring"), default="allgather")
    p.add_argument("--base", choices=("none", "local"), default="none")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--v-heads", type=int, default=32, help="value heads HV")
    p.add_argument("--head-dim", type=int, default=128, help="K = V")
    kcp_bench.add_run_args(p, cuda_warmup=2, cuda_reps=10, extra=lambda q: q.add_argument(
        "--l2norm", action="store_true", help="use_qk_l2norm_in_kernel=True"))
    a = p.parse_args(argv)
    kcp_bench.check_positive(p, a, ("seqlen", "docs", "heads", "v_heads", "head_dim"))
    kcp_bench.check_docs(p, a)
    if a.v_heads % a.heads:
        p.error("--v-heads must be a multiple of --heads")
    return a


# ----------------------------------------------------------------------------- inputs


def global_inputs(T, H, HV, K, dtype, device, seed):
    """q, k (L2-normalised), v, g (logsigmoid), beta (sigmoid), do: the same in every
    process (a seeded generator on ``device``)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    q = rn(1, T, H, K).to(dtype)
    k = torch.nn.functional.normalize(rn(1, T, H, K), dim=-1).to(dtype)
    v = rn(1, T, HV, K).to(dtype)
    g = torch.nn.functional.logsigmoid(rn(1, T, HV))
    beta = torch.sigmoid(rn(1, T, HV))
    do = rn(1, T, HV, K).to(dtype)
    return [q, k, v, g, beta, do]


# ----------------------------------------------------------------------------- one rank


#: the KCP entries timed, by name in ``module`` (cake-gdn-nondet-train-kcp's benchmark
#: passes its own to :func:`run_rank`)
API = dict(module="cake_gdn_det_train_kcp", fwd="chunk_gdn_det_fwd_kcp",
           bwd="chunk_gdn_det_bwd_kcp", build="build_context_det_kcp",
           partition="partition_det_kcp", comm="comm_bytes")


def run_rank(rank: int, W: int, a, device: torch.device, api: dict | None = None) -> dict:
    from cake_core.testing import rel_fro_error
    from cake_gdn_det_train import chunk_gdn_det_bwd, chunk_gdn_det_fwd

    api = api or API
    m = importlib.import_module(api["module"])
    build_context_det_kcp = getattr(m, api["build"])
    partition_det_kcp = getattr(m, api["partition"])
    chunk_gdn_det_fwd_kcp = getattr(m, api["fwd"])
    chunk_gdn_det_bwd_kcp = getattr(m, api["bwd"])
    comm_bytes = getattr(m, api["comm"])

    T, H, HV, K = a.seqlen, a.heads, a.v_heads, a.head_dim
    dtype = DTYPES[a.dtype]
    cu = make_cu(T, a.docs, a.boundary, a.layout, W, a.seed)
    part = partition_det_kcp(torch.tensor(cu, dtype=torch.int64), W, a.layout)
    ctx = build_context_det_kcp(part, None, rank, device, exchange=a.exchange)
    idx = part.global_index(rank).to(device)
    glob = global_inputs(T, H, HV, K, dtype, device, a.seed)
    local = [t[:, idx].contiguous() for t in glob]
    if not (a.base == "local" and rank == 0) and not a.check:
        del glob
    l2 = a.l2norm
    warmup, reps = kcp_bench.warmup_reps(a, device, 2, 10)

    def fwd():
        return chunk_gdn_det_fwd_kcp(*local[:5], ctx, use_qk_l2norm_in_kernel=l2)

    def step():
        o, saved = fwd()
        return (o, *chunk_gdn_det_bwd_kcp(local[5], saved, ctx))

    rec = {"rank": rank, "tokens": ctx.num_tokens, "fragments": ctx.num_fragments,
           "recv": len(ctx.recv), "send": len(ctx.send),
           "middle": sum(1 for f in ctx.fragments if f.has_prev and f.has_next),
           "bytes": comm_bytes(ctx, K, K, HV)}
    t0 = time.perf_counter()
    first = step()
    kcp_bench.sync(device)
    rec["first_call_s"] = time.perf_counter() - t0
    rec["fwd"] = timed(fwd, device, warmup, reps)
    _, saved = fwd()
    rec["bwd"] = timed(lambda: chunk_gdn_det_bwd_kcp(local[5], saved, ctx), device, warmup,
                       reps)
    rec["fwd_bwd"] = timed(step, device, warmup, reps)
    saved = None  # noqa: F841 - frees the saved set before the checks
    if a.check:
        again = step()
        rec["hash"] = sha(first)
        rec["repeat_bitwise"] = rec["hash"] == sha(again)
        o, _, s = chunk_gdn_det_fwd(*glob[:5], use_qk_l2norm_in_kernel=l2,
                                    cu_seqlens=torch.tensor(cu, dtype=torch.int64, device=device))
        gr = chunk_gdn_det_bwd(glob[5], None, s)
        ref = (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta)
        rec["rel_err"] = {n: (rel_fro_error(x, r[:, idx]) if x.numel() else 0.0)
                          for n, x, r in zip(("o", "dq", "dk", "dv", "dg", "dbeta"), first, ref,
                                             strict=True)}
        del o, s, gr, ref
    del first
    dist.barrier()
    if a.base == "local":
        if rank == 0:
            cu_dev = torch.tensor(cu, dtype=torch.int64, device=device)

            def lfwd():
                return chunk_gdn_det_fwd(*glob[:5], use_qk_l2norm_in_kernel=l2,
                                         cu_seqlens=cu_dev)

            def lstep():
                o, _, s = lfwd()
                return chunk_gdn_det_bwd(glob[5], None, s)

            lstep()
            _, _, s = lfwd()
            rec["local"] = {"fwd": timed(lfwd, device, warmup, reps, group=False),
                            "bwd": timed(lambda: chunk_gdn_det_bwd(glob[5], None, s), device,
                                         warmup, reps, group=False),
                            "fwd_bwd": timed(lstep, device, warmup, reps, group=False)}
        dist.barrier()
    return rec


def summary(a, W, device, recs) -> dict:
    return kcp_bench.summary(a, W, device, recs, {
        "exchange": a.exchange, "H": a.heads, "HV": a.v_heads, "K": a.head_dim,
        "V": a.head_dim, "dtype": a.dtype, "l2norm": a.l2norm})


def main(argv=None) -> int:
    return kcp_bench.main(parse_args(argv), run_rank, summary)


if __name__ == "__main__":
    sys.exit(main())
