"""Benchmark cake-moe-grouped-nondet-gemm against its det sibling, a training step each.

For each case (E experts of weight [E, N, K], M = tokens · top_k rows routed ``balanced``
or ``skewed``, as the det benchmark builds them), one step is the autograd forward and
backward (dx, dW) through ``moe_grouped_nondet_gemm`` and through
cake-moe-grouped-det-gemm's ``moe_grouped_det_gemm``, each with its own default plan.
``ratio`` = nondet ms / det ms (below 1: nondet faster). Today nondet runs the det
kernels, so the ratio measures the entries' host overhead only; ``same_bits`` records
whether both gave the same y, dx and dW.

GPU run (one H200)::

    cd packages/cake-moe-grouped-nondet-gemm/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_moe_grouped_nondet_gemm.py --out $OUT/moe_nondet.json

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_moe_grouped_nondet_gemm.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import random
import sys

from cake_core import bench
from cake_core.bench import Timer

#: the det benchmark's cases
DEFAULT_EXPERTS = (8, 64, 128)
DEFAULT_NK = ((3072, 4096), (4096, 1536))
DEFAULT_TOKENS, DEFAULT_TOP_K = 16384, 8
QUICK_CPU = {"experts": (3,), "nk": ((24, 40),), "tokens": 16, "top_k": 2}
ROUTINGS = ("balanced", "skewed")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    return p


def group_sizes(M: int, E: int, routing: str, seed: int = 0) -> list[int]:
    """Rows per expert summing to M, as the det benchmark's: ``balanced`` (as even as
    integers allow) or ``skewed`` (E // 4 experts empty, the rest Zipf-like, shuffled)."""
    if routing == "balanced":
        return [M // E + (1 if e < M % E else 0) for e in range(E)]
    live = max(1, E - E // 4)
    weights = [1.0 / (r + 1) ** 1.2 for r in range(live)]
    sizes = [int(M * w / sum(weights)) for w in weights]
    sizes[0] += M - sum(sizes)
    sizes += [0] * (E - live)
    random.Random(seed).shuffle(sizes)
    return sizes


def run_case(E: int, N: int, K: int, M: int, routing: str, dtype, device: str,
             timer: Timer) -> dict:
    import torch
    from cake_moe_grouped_det_gemm import moe_grouped_det_gemm
    from cake_moe_grouped_nondet_gemm import moe_grouped_nondet_gemm

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(device, dtype).requires_grad_()
    dy = torch.randn(M, N, generator=g).to(device, dtype)
    sizes = torch.tensor(group_sizes(M, E, routing), dtype=torch.int64)
    offs = torch.cumsum(sizes, 0).to(device, torch.int32)
    rec: dict = {"E": E, "N": N, "K": K, "M": M, "routing": routing}
    outs = {}
    for name, fn in (("det", moe_grouped_det_gemm), ("nondet", moe_grouped_nondet_gemm)):
        def step(fn=fn):
            x.grad = w.grad = None
            y = fn(x, w, offs)
            y.backward(dy)
            return y

        y = step()
        outs[name] = [y.detach().clone(), x.grad.clone(), w.grad.clone()]
        rec[name] = timer.bench(step)
    rec["ratio"] = rec["nondet"]["ms"] / rec["det"]["ms"]
    rec["same_bits"] = all(bench.bits_sha256([a]) == bench.bits_sha256([c])
                           for a, c in zip(outs["det"], outs["nondet"], strict=True))
    return rec


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if bench.cuda_missing(args.device):
        return 2
    import torch

    dtype = getattr(torch, DTYPES[args.dtype])
    timer = Timer(args.device, args.quick, args.warmup, args.rep)
    cpu = args.device == "cpu"
    experts = QUICK_CPU["experts"] if cpu else DEFAULT_EXPERTS
    nks = QUICK_CPU["nk"] if cpu else DEFAULT_NK
    M = (QUICK_CPU["tokens"] * QUICK_CPU["top_k"] if cpu
         else DEFAULT_TOKENS * DEFAULT_TOP_K)
    results = []
    for E in experts:
        for N, K in nks:
            for routing in ROUTINGS:
                tag = f"E={E} {N}x{K} M={M} {routing}"
                try:
                    rec = run_case(E, N, K, M, routing, dtype, args.device, timer)
                    print(f"{tag}: det {bench.fmt(rec['det']['ms'], '.3f')} ms, nondet "
                          f"{bench.fmt(rec['nondet']['ms'], '.3f')} ms, ratio "
                          f"{rec['ratio']:.3f}, same bits {rec['same_bits']}")
                except Exception as e:  # noqa: BLE001 - recorded, the other cases still run
                    rec = {"E": E, "N": N, "K": K, "M": M, "routing": routing,
                           **bench.error_record(e)}
                    print(f"{tag}: {rec['error']}")
                results.append(rec)
                bench.free_memory(args.device)
    bench.write_json(args.out, {"device": bench.device_description(args.device),
                                "dtype": args.dtype, "timer": timer.kind, "when": bench.utc_now(),
                                "results": results})
    return 0 if all("ratio" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
