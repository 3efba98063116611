"""Benchmark cake-dense-projection-nondet-gemm against its det sibling, a training step each.

For each shape y[M, N] = x[M, K] · W[N, K]ᵀ (with bias), one step is the autograd forward
and backward (dx, dW, dbias) through ``dense_projection_nondet`` and through
cake-dense-projection-det-gemm's ``dense_projection_det``, each with its own default plan.
``ratio`` = nondet ms / det ms (below 1: nondet faster), each the median of ``--rounds``
rounds that time det and nondet in turn. On CUDA in bf16 the nondet plan takes the weight
and bias gradients from cuBLAS / ``torch.sum`` (``cublas_wgrad``) where det runs its
fixed-order kernels; ``same_bits`` records whether both gave the same y, dx, dW and dbias
(y and dx come from the same launches).

GPU run (one H200)::

    cd packages/cake-dense-projection-nondet-gemm/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_dense_projection_nondet_gemm.py --out $OUT/dense_nondet.json

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_dense_projection_nondet_gemm.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys

from cake_core import bench
from cake_core.bench import Timer

#: the det benchmark's shapes (MxNxK)
DEFAULT_SHAPES = ((16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
                  (4096, 128, 8192))
QUICK_CPU_SHAPES = ((64, 24, 40),)
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--shapes", default=None,
                   type=lambda t: bench.parse_shapes(t, 3, "MxNxK, e.g. 4096x128x8192"),
                   help="comma-separated MxNxK (default: the det benchmark's four)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--rounds", type=int, default=3,
                   help="det / nondet timed in turn this many rounds, the median kept")
    return p


def run_shape(M: int, N: int, K: int, dtype, device: str, timer: Timer,
              rounds: int = 3) -> dict:
    import torch
    from cake_dense_projection_det_gemm import dense_projection_det
    from cake_dense_projection_nondet_gemm import dense_projection_nondet

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(M, K, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(device, dtype).requires_grad_()
    b = torch.randn(N, generator=g).to(device, dtype).requires_grad_()
    dy = torch.randn(M, N, generator=g).to(device, dtype)
    rec: dict = {"M": M, "N": N, "K": K}
    outs, steps = {}, {}
    for name, fn in (("det", dense_projection_det), ("nondet", dense_projection_nondet)):
        def step(fn=fn):
            for t in (x, w, b):
                t.grad = None
            y = fn(x, w, b)
            y.backward(dy)
            return y

        y = step()
        outs[name] = [y.detach().clone()] + [t.grad.clone() for t in (x, w, b)]
        steps[name] = step
    rec.update(timer.alternating(steps, rounds))
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
    shapes = args.shapes or (QUICK_CPU_SHAPES if args.device == "cpu" else DEFAULT_SHAPES)
    results = []
    for M, N, K in shapes:
        try:
            rec = run_shape(M, N, K, dtype, args.device, timer, args.rounds)
        except Exception as e:  # noqa: BLE001 - recorded, the other shapes still run
            rec = {"M": M, "N": N, "K": K, **bench.error_record(e)}
        results.append(rec)
        if "ratio" in rec:
            print(f"{M}x{N}x{K}: det {bench.fmt(rec['det']['ms'], '.3f')} ms, nondet "
                  f"{bench.fmt(rec['nondet']['ms'], '.3f')} ms, ratio {rec['ratio']:.3f}, "
                  f"same bits {rec['same_bits']}")
        else:
            print(f"{M}x{N}x{K}: {rec['error']}")
        bench.free_memory(args.device)
    bench.write_json(args.out, {"device": bench.device_description(args.device),
                                "dtype": args.dtype, "timer": timer.kind, "when": bench.utc_now(),
                                "results": results})
    return 0 if all("ratio" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
