"""Benchmark cake-mhc-nondet-train against its det sibling, a training step each.

For each width C (T tokens of n streams, X ``[T, n, C]``, the identity branch B = U as in
the det benchmark), one step is ``prepare`` + ``finish`` and the gradients of X, phi,
alpha and bias from dY (``torch.autograd.grad``) through ``mhc_nondet_prepare`` /
``mhc_nondet_finish`` and through cake-mhc-det-train's ``mhc_det_prepare`` /
``mhc_det_finish``, each with its own default plan. ``ratio`` = nondet ms / det ms (below
1: nondet faster). Today nondet runs the det kernels, so the ratio measures the entries'
host overhead only; ``same_bits`` records whether both gave the same Y and gradients.

GPU run (one H200; T = 16384, n = 4, C in 2048, 4096, 7168, bf16)::

    cd packages/cake-mhc-nondet-train/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_mhc_nondet_train.py --out $OUT/mhc_nondet.json

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_mhc_nondet_train.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys

from cake_core import bench
from cake_core.bench import Timer

#: the det benchmark's cases
DEFAULT_T, DEFAULT_N, DEFAULT_C = 16384, 4, (2048, 4096, 7168)
QUICK_CPU = {"tokens": 24, "n": 4, "hidden": (16,)}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    return p


def run_case(T: int, n: int, C: int, dtype, device: str, timer: Timer) -> dict:
    import torch
    from cake_mhc_det_train import mhc_det_finish, mhc_det_prepare
    from cake_mhc_nondet_train import mhc_nondet_finish, mhc_nondet_prepare

    M = 2 * n + n * n
    g = torch.Generator(device="cpu").manual_seed(0)
    X = torch.randn(T, n, C, generator=g).to(device, dtype).requires_grad_()
    phi = (torch.randn(n * C, M, generator=g) * (n * C) ** -0.5).to(device).requires_grad_()
    alpha = torch.full((3,), 0.5, device=device, requires_grad=True)
    bias = (torch.randn(M, generator=g) * 0.5).to(device).requires_grad_()
    dY = torch.randn(T, n, C, generator=g).to(device, dtype)
    leaves = (X, phi, alpha, bias)
    rec: dict = {"T": T, "n": n, "C": C}
    outs = {}
    for name, (prepare, finish) in (("det", (mhc_det_prepare, mhc_det_finish)),
                                    ("nondet", (mhc_nondet_prepare, mhc_nondet_finish))):
        def step(prepare=prepare, finish=finish):
            U, h = prepare(X, phi, alpha, bias)
            Y = finish(X, U, h)
            return [Y.detach(), *torch.autograd.grad(Y, leaves, dY)]

        outs[name] = step()
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
    T, n = (QUICK_CPU["tokens"], QUICK_CPU["n"]) if cpu else (DEFAULT_T, DEFAULT_N)
    results = []
    for C in QUICK_CPU["hidden"] if cpu else DEFAULT_C:
        try:
            rec = run_case(T, n, C, dtype, args.device, timer)
            print(f"T={T} n={n} C={C}: det {bench.fmt(rec['det']['ms'], '.3f')} ms, nondet "
                  f"{bench.fmt(rec['nondet']['ms'], '.3f')} ms, ratio {rec['ratio']:.3f}, "
                  f"same bits {rec['same_bits']}")
        except Exception as e:  # noqa: BLE001 - recorded, the other widths still run
            rec = {"T": T, "n": n, "C": C, **bench.error_record(e)}
            print(f"T={T} n={n} C={C}: {rec['error']}")
        results.append(rec)
        bench.free_memory(args.device)
    bench.write_json(args.out, {"device": bench.device_description(args.device),
                                "dtype": args.dtype, "timer": timer.kind, "when": bench.utc_now(),
                                "results": results})
    return 0 if all("ratio" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
