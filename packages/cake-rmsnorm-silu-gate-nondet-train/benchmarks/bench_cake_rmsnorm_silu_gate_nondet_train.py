"""Benchmark cake-rmsnorm-silu-gate-nondet-train against its det sibling (forward,
forward+backward), in FLA's and Mamba2's gate orders.

Today the nondet package launches cake-rmsnorm-silu-gate-det-train's kernels with the det
rule's plans, so the expected ratio is about 1.0 (the alert's check per backward aside);
this script is the measurement that says so, and the one a faster nondet design must beat.
Each case times det and nondet alternately (``--rounds`` rounds, the median kept) and
records whether their y, dx, dz and dweight have the same bits (expected today: the same
kernels and plans).

Typical GPU run (the det benchmark's default shapes, rows x D)::

    cd packages/cake-rmsnorm-silu-gate-nondet-train
    PYTHONPATH=$(ls -d ../*/src | paste -sd:) python3 \\
        benchmarks/bench_cake_rmsnorm_silu_gate_nondet_train.py --out $OUT/gate_norm_nd.json

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

DEFAULT_SHAPES = ((524288, 128), (1048576, 128))
ORDERS = {"fla": True, "mamba": False}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the records to this JSON file")
    p.add_argument("--shapes", type=lambda t: bench.parse_shapes(t, 2, "rowsxD, e.g. 1024x128"),
                   default=list(DEFAULT_SHAPES), help="comma-separated rowsxD list")
    p.add_argument("--orders", type=lambda t: bench.parse_names(t, tuple(ORDERS), what="orders"),
                   default=list(ORDERS), help="fla (norm before gate), mamba (gate first)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small timing budgets (smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="alternating det / nondet rounds")
    return p


def run_case(rows: int, D: int, order: str, dtype: torch.dtype, device: str, timer: Timer,
             rounds: int) -> dict:
    from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det
    from cake_rmsnorm_silu_gate_nondet_train import rmsnorm_silu_gate_nondet

    nbg = ORDERS[order]
    gen = torch.Generator(device=device).manual_seed(rows + D)
    x = torch.randn(rows, D, device=device, dtype=dtype, generator=gen).requires_grad_()
    z = (3 * torch.randn(rows, D, device=device, generator=gen)).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(D, device=device, generator=gen)).to(dtype).requires_grad_()
    dy = torch.randn(rows, D, device=device, dtype=dtype, generator=gen)
    fns = {"det": rmsnorm_silu_gate_det, "nondet": rmsnorm_silu_gate_nondet}
    outs = {}
    for name, fn in fns.items():
        y = fn(x, z, w, norm_before_gate=nbg)
        outs[name] = (y.detach(), *torch.autograd.grad(y, (x, z, w), dy))
    same = all(torch.equal(a, b) for a, b in zip(outs["det"], outs["nondet"], strict=True))
    times = {name: {"fwd": [], "fwdbwd": []} for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name]["fwd"].append(timer.bench(
                lambda fn=fn: fn(x, z, w, norm_before_gate=nbg))["ms"])
            times[name]["fwdbwd"].append(timer.bench(
                lambda fn=fn: torch.autograd.grad(fn(x, z, w, norm_before_gate=nbg),
                                                  (x, z, w), dy))["ms"])
    rec = {"rows": rows, "D": D, "order": order, "dtype": str(dtype)[6:],
           "same_bits_as_det": same}
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
    print(f"{'rows x D':>14} {'order':>6} {'fwd ratio':>10} {'f+b ratio':>10} "
          f"{'det f+b ms':>11} same bits")
    for rows, D in args.shapes:
        for order in args.orders:
            rec = run_case(rows, D, order, dtype, args.device, timer, max(1, args.rounds))
            records.append(rec)
            print(f"{f'{rows}x{D}':>14} {order:>6} {rec['fwd']['ratio']:>10.3f} "
                  f"{rec['fwdbwd']['ratio']:>10.3f} {rec['fwdbwd']['det_ms']:>11.4f} "
                  f"{rec['same_bits_as_det']}")
            bench.free_memory(args.device)
    write_json(args.out, {"benchmark": "cake-rmsnorm-silu-gate-nondet-train vs "
                                       "cake-rmsnorm-silu-gate-det-train",
                          "device": bench.device_description(args.device),
                          "timer": timer.kind, "utc": bench.utc_now(), "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
