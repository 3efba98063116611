"""Benchmark cake-rmsnorm-nondet-train against its det sibling (forward, forward+backward).

Today the nondet package launches cake-rmsnorm-det-train's kernels with the det rule's
plans, so the expected ratio is about 1.0 (the alert's check per backward aside); this
script is the measurement that says so, and the one a faster nondet design must beat.
Each shape times det and nondet alternately (``--rounds`` rounds, the median kept) and
records whether their y, dx and dweight have the same bits (expected today: the same
kernels and plans).

Typical GPU run (the det benchmark's default shapes)::

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 \\
        packages/cake-rmsnorm-nondet-train/benchmarks/bench_cake_rmsnorm_nondet_train.py \\
        --out $OUT/rmsnorm_nondet_bench.json

CPU smoke test: ``--device cpu --shapes 64x128 --quick``. Ratios are nondet_time /
det_time: below 1 means the nondet package is faster.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from cake_core import bench
from cake_core.bench import Timer, write_json

DEFAULT_SHAPES = ((32768, 4096), (16384, 8192), (65536, 2048))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the records to this JSON file")
    p.add_argument("--shapes", type=lambda t: bench.parse_shapes(t, 2, "TxH, e.g. 1024x512"),
                   default=list(DEFAULT_SHAPES), help="comma-separated TxH list")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small timing budgets (smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="alternating det / nondet rounds")
    return p


def run_shape(T: int, H: int, dtype: torch.dtype, device: str, timer: Timer,
              rounds: int) -> dict:
    from cake_rmsnorm_det_train import rmsnorm_det
    from cake_rmsnorm_nondet_train import rmsnorm_nondet

    gen = torch.Generator(device=device).manual_seed(T + H)
    x = torch.randn(T, H, device=device, dtype=dtype, generator=gen).requires_grad_()
    w = (1 + 0.1 * torch.randn(H, device=device, generator=gen)).to(dtype).requires_grad_()
    dy = torch.randn(T, H, device=device, dtype=dtype, generator=gen)
    fns = {"det": rmsnorm_det, "nondet": rmsnorm_nondet}
    outs = {}
    for name, fn in fns.items():
        y = fn(x, w)
        outs[name] = (y.detach(), *torch.autograd.grad(y, (x, w), dy))
    same = all(torch.equal(a, b) for a, b in zip(outs["det"], outs["nondet"], strict=True))
    times = {name: {"fwd": [], "fwdbwd": []} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name]["fwd"].append(timer.bench(lambda fn=fn: fn(x, w))["ms"])
            times[name]["fwdbwd"].append(timer.bench(
                lambda fn=fn: torch.autograd.grad(fn(x, w), (x, w), dy))["ms"])
    rec = {"T": T, "H": H, "dtype": str(dtype)[6:], "same_bits_as_det": same}
    for phase in ("fwd", "fwdbwd"):
        det_ms = statistics.median(times["det"][phase])
        nd_ms = statistics.median(times["nondet"][phase])
        rec[phase] = {"det_ms": det_ms, "nondet_ms": nd_ms, "ratio": nd_ms / det_ms}
    return rec


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if bench.cuda_missing(args.device):
        return 2
    dtype = DTYPES[args.dtype] if args.dtype else (
        torch.bfloat16 if args.device == "cuda" else torch.float32)
    timer = Timer(args.device, args.quick, None, None)
    records = []
    print(f"{'T x H':>14} {'fwd ratio':>10} {'f+b ratio':>10} {'det f+b ms':>11} same bits")
    for T, H in args.shapes:
        rec = run_shape(T, H, dtype, args.device, timer, max(1, args.rounds))
        records.append(rec)
        print(f"{f'{T}x{H}':>14} {rec['fwd']['ratio']:>10.3f} {rec['fwdbwd']['ratio']:>10.3f} "
              f"{rec['fwdbwd']['det_ms']:>11.4f} {rec['same_bits_as_det']}")
        bench.free_memory(args.device)
    write_json(args.out, {"benchmark": "cake-rmsnorm-nondet-train vs cake-rmsnorm-det-train",
                          "device": bench.device_description(args.device),
                          "timer": timer.kind, "utc": bench.utc_now(), "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
