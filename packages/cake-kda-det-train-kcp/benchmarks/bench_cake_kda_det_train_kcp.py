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
(:func:`cake_kda_det_train_kcp.comm_bytes`). ``--base local``: rank 0 also runs the
same documents (all T tokens) through the single-rank package (``chunk_kda_det_fwd`` /
``chunk_kda_det_bwd``) for comparison; the others wait. ``--check``: every rank compares
its outputs and gradients with the single-rank package's on its tokens (relative Frobenius
error; dA_log / ddt_bias when reduced) and repeats its KCP run to compare sha256 of the
bits. Rank 0 prints one JSON record (and writes it to ``--out``).
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

GRAD_NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")


def _gate_args(p):
    p.add_argument("--l2norm", action="store_true", help="use_qk_l2norm_in_kernel=True")
    p.add_argument("--gate", choices=("none", "softplus", "lower_bound"), default="none",
                   help="FLA's in-kernel gate (and beta sigmoid)")
    p.add_argument("--no-reduce-gate-grads", action="store_true",
                   help="reduce_gate_param_grads=False (each rank keeps its share)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kcp_bench.add_document_args(p)
    p.add_argument("--exchange", choices=("allgather", "ring"), default="allgather")
    p.add_argument("--base", choices=("none", "local"), default="none")
    p.add_argument("--heads", type=int, default=16, help="q/k heads H")
    p.add_argument("--v-heads", type=int, default=32, help="value heads HV")
    p.add_argument("--head-dim", type=int, default=128, help="K = V")
    kcp_bench.add_run_args(p, cuda_warmup=2, cuda_reps=10, extra=_gate_args)
    a = p.parse_args(argv)
    kcp_bench.check_positive(p, a, ("seqlen", "docs", "heads", "v_heads", "head_dim"))
    kcp_bench.check_docs(p, a)
    if a.v_heads % a.heads:
        p.error("--v-heads must be a multiple of --heads")
    return a


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


# ----------------------------------------------------------------------------- one rank


#: the KCP entries timed, by name in ``module`` (cake-kda-nondet-train-kcp's benchmark
#: passes its own to :func:`run_rank`)
API = dict(module="cake_kda_det_train_kcp", fwd="chunk_kda_det_fwd_kcp",
           bwd="chunk_kda_det_bwd_kcp", build="build_context_det_kcp",
           partition="partition_det_kcp", comm="comm_bytes")


def run_rank(rank: int, W: int, a, device: torch.device, api: dict | None = None) -> dict:
    from cake_core.testing import rel_fro_error
    from cake_kda_det_train import chunk_kda_det_bwd, chunk_kda_det_fwd

    api = api or API
    m = importlib.import_module(api["module"])
    build_context_det_kcp = getattr(m, api["build"])
    partition_det_kcp = getattr(m, api["partition"])
    chunk_kda_det_fwd_kcp = getattr(m, api["fwd"])
    chunk_kda_det_bwd_kcp = getattr(m, api["bwd"])
    comm_bytes = getattr(m, api["comm"])
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
    warmup, reps = kcp_bench.warmup_reps(a, device, 2, 10)

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
           "bytes": comm_bytes(ctx, K, K, HV, gate_grad_floats=gate_floats)}
    t0 = time.perf_counter()
    first = step()
    kcp_bench.sync(device)
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
    return kcp_bench.summary(a, W, device, recs, {
        "exchange": a.exchange, "H": a.heads, "HV": a.v_heads, "K": a.head_dim,
        "V": a.head_dim, "dtype": a.dtype, "l2norm": a.l2norm, "gate": a.gate,
        "reduce_gate_param_grads": not a.no_reduce_gate_grads})


def main(argv=None) -> int:
    return kcp_bench.main(parse_args(argv), run_rank, summary)


if __name__ == "__main__":
    sys.exit(main())
