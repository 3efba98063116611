"""Benchmark cake's deterministic dense projection GEMMs against torch.matmul (cuBLAS).

Phases, for y[M, N] = x[M, K] · W[N, K]ᵀ (2·M·N·K flops each):

- ``fwd``: y = x · Wᵀ                         (torch: ``x @ w.t()``)
- ``dgrad``: dx = dy · W                      (torch: ``dy @ w``)
- ``wgrad``: dW = dyᵀ · x (plan's split-K)    (torch: ``dy.t() @ x``)
- ``wgrad_acc``: main_grad += dyᵀ · x in fp32 (torch: ``main_grad.add_(dy.t() @ x)``,
  which rounds dW to bf16 first: an anchor for time, not for numerics)

cake phases call the family's launch functions directly (no autograd, no input checks), with
the plan ``make_plan`` picks (recorded in the JSON) and a workspace built once. Ratios are
cake_time / torch_time: below 1 means cake is faster. Each shape also checks cake against a
float64 reference (relative Frobenius error) and that wgrad repeats bit for bit.

GPU run (one H200)::

    cd packages/cake-dense-projection-det-gemm/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_dense_projection_det_gemm.py --out $OUT/dense_bench.json

Plan overrides (``--plan key=val ...``, ints, applied to every shape's ``make_plan`` plan and
recorded in the JSON), e.g. the TMA wgrad (``wgrad_tma = 1``; ``2`` = persistent)::

    ... bench_cake_dense_projection_det_gemm.py --plan wgrad_tma=1 --out $OUT/dense_tma.json

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_dense_projection_det_gemm.py --device cpu --quick

Timing on CUDA: ``triton.testing.do_bench`` (warmup/rep in ms, L2 flushed), median reported
(p20/p80 kept in the JSON). ``torch.use_deterministic_algorithms(True)`` is on for the torch
anchors, as in a det training run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from cake_core import bench
from cake_core.bench import Timer

DEFAULT_SHAPES = ((16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336),
                  (4096, 128, 8192))
QUICK_CPU_SHAPES = ((200, 48, 96), (512, 16, 64))
PHASES = ("fwd", "dgrad", "wgrad", "wgrad_acc")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    return bench.parse_shapes(text, 3, "MxNxK, e.g. 4096x128x8192", strict=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="comma-separated MxNxK (default: the issue's four; CPU --quick: tiny)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--no-check", action="store_true", help="skip accuracy/repeat checks")
    p.add_argument("--sweep", action="store_true",
                   help="also time tile/split variants of the plan per phase (each checked "
                        "against an fp32 product): the data behind make_plan's rules")
    p.add_argument("--plan", nargs="*", default=[], metavar="KEY=VAL",
                   help="override plan fields (ints) of every shape, e.g. wgrad_tma=1")
    return p


def parse_overrides(items: list[str]) -> dict[str, int]:
    """``["wgrad_tma=1", ...]`` -> ``{"wgrad_tma": 1, ...}`` (ints only)."""
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep:
            raise SystemExit(f"--plan: expected KEY=VAL, got {item!r}")
        try:
            out[key.strip()] = int(val)
        except ValueError:
            raise SystemExit(f"--plan: {key}: expected an int, got {val!r}") from None
    return out


#: (block_m, block_n, block_k, num_warps, num_stages) variants tried by --sweep.
SWEEP_TILES = ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
               (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 128, 8, 3),
               (64, 256, 64, 4, 4), (64, 128, 64, 4, 4))
SWEEP_SPLITS = (1, 2, 4, 8)


def sweep_shape(M, N, K, x, w, dy, plan, timer: Timer) -> list[dict[str, Any]]:
    """Time each tile variant for fwd/dgrad/wgrad (and each split count for wgrad)."""

    import torch
    from cake_dense_projection_det_gemm import DenseProjectionDetWorkspace
    from cake_dense_projection_det_gemm.api import _launch_bwd, _launch_fwd

    flops = 2.0 * M * N * K
    xf, wf, dyf = x.float(), w.float(), dy.float()
    refs = {"fwd": xf @ wf.t(), "dgrad": dyf @ wf, "wgrad": dyf.t() @ xf}
    del xf, wf, dyf
    rows = []
    variants = [("tiles", t, plan.wgrad_splits) for t in SWEEP_TILES]
    variants += [("splits", None, s) for s in SWEEP_SPLITS if s != plan.wgrad_splits]
    for _kind, tiles, splits in variants:
        if tiles is None:
            p = dataclasses.replace(plan, wgrad_splits=splits)
            phases = ("wgrad",)
        else:
            bm, bn, bk, wp, st = tiles
            p = dataclasses.replace(plan, block_m=bm, block_n=bn, block_k=bk, num_warps=wp,
                                    num_stages=st, wgrad_block_m=bm, wgrad_block_n=bn,
                                    wgrad_block_k=bk, wgrad_num_warps=wp,
                                    wgrad_num_stages=st, wgrad_splits=splits)
            phases = ("fwd", "dgrad", "wgrad")
        ws = DenseProjectionDetWorkspace.for_plan(p, x.device)
        parts, bparts = ws["partials"], ws["bias_partials"]
        fns = {"fwd": lambda p=p: _launch_fwd(x, w, None, p),
               "dgrad": lambda p=p, a=parts, b=bparts: _launch_bwd(
                   dy, x, w, p, a, b, None, True, False, False)[0],
               "wgrad": lambda p=p, a=parts, b=bparts: _launch_bwd(
                   dy, x, w, p, a, b, None, False, True, False)[1]}
        for ph in phases:
            row = {"phase": ph, "tiles": tiles, "splits": splits}
            try:
                out = fns[ph]().float()
                ref = refs[ph]
                row["rel_err"] = float(torch.linalg.vector_norm(out - ref)
                                       / torch.linalg.vector_norm(ref))
                del out
                t = timer.bench(fns[ph])
                row["ms"] = t["ms"]
                row["tflops"] = flops / (t["ms"] * 1e-3) / 1e12
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            print(f"  sweep {ph:6s} tiles={tiles} splits={splits}: "
                  + (f"{row['ms']:.3f} ms {row['tflops']:.0f} TFLOP/s err {row['rel_err']:.1e}"
                     if "ms" in row else row["error"]), flush=True)
        del ws, parts, bparts
    return rows


def run_shape(M: int, N: int, K: int, dtype, device: str, timer: Timer, check: bool,
              sweep: bool = False, overrides: dict[str, int] | None = None):
    import torch
    from cake_core.testing import bitwise_equal
    from cake_core.testing import rel_fro_error as rel_err
    from cake_dense_projection_det_gemm import DenseProjectionDetWorkspace, make_plan
    from cake_dense_projection_det_gemm.api import _launch_bwd, _launch_fwd

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
    w = torch.randn(N, K, device=device, dtype=dtype, generator=g) * K ** -0.5
    dy = torch.randn(M, N, device=device, dtype=dtype, generator=g)
    main_grad = torch.zeros(N, K, device=device, dtype=torch.float32)
    plan = make_plan(M, N, K, dtype, device)
    if overrides:
        from cake_dense_projection_det_gemm.plan import wgrad_tma_problem

        plan = dataclasses.replace(plan, **overrides)
        why = wgrad_tma_problem(plan, dtype)  # the launch functions skip the API's checks
        if why is not None:
            raise ValueError(why)
    ws = DenseProjectionDetWorkspace.for_plan(plan, device)
    parts, bparts = ws["partials"], ws["bias_partials"]

    cake = {
        "fwd": lambda: _launch_fwd(x, w, None, plan),
        "dgrad": lambda: _launch_bwd(dy, x, w, plan, parts, bparts, None, True, False, False),
        "wgrad": lambda: _launch_bwd(dy, x, w, plan, parts, bparts, None, False, True, False),
        "wgrad_acc": lambda: _launch_bwd(dy, x, w, plan, parts, bparts, main_grad, False, True,
                                         False),
    }
    anchor = {
        "fwd": lambda: x @ w.t(),
        "dgrad": lambda: dy @ w,
        "wgrad": lambda: dy.t() @ x,
        "wgrad_acc": lambda: main_grad.add_(dy.t() @ x),
    }
    flops = 2.0 * M * N * K
    res: dict[str, Any] = {"M": M, "N": N, "K": K, "plan": plan.to_dict(), "phases": {}}
    if check:
        x64, w64, dy64 = x.double(), w.double(), dy.double()
        res["rel_err"] = {
            "fwd": rel_err(cake["fwd"](), x64 @ w64.t()),
            "dgrad": rel_err(cake["dgrad"]()[0], dy64 @ w64),
            "wgrad": rel_err(cake["wgrad"]()[1], dy64.t() @ x64),
        }
        del x64, w64, dy64
        res["wgrad_bitwise_repeat"] = bitwise_equal(cake["wgrad"]()[1], cake["wgrad"]()[1])
    for ph in PHASES:
        row = {}
        for name, fns in (("cake", cake), ("torch", anchor)):
            try:
                t = timer.bench(fns[ph])
                t["tflops"] = flops / (t["ms"] * 1e-3) / 1e12
                row[name] = t
            except Exception as exc:  # noqa: BLE001 - recorded, not fatal
                row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if "ms" in row["cake"] and "ms" in row["torch"]:
            row["ratio"] = row["cake"]["ms"] / row["torch"]["ms"]
        res["phases"][ph] = row
    if sweep:
        res["sweep"] = sweep_shape(M, N, K, x, w, dy, plan, timer)
    return res


def markdown_shape(res: dict[str, Any]) -> str:
    lines = [f"### M={res['M']} N={res['N']} K={res['K']} (wgrad_splits="
             f"{res['plan']['wgrad_splits']})", "",
             "| phase | cake ms | cake TFLOP/s | cuBLAS ms | cuBLAS TFLOP/s | cake/cuBLAS |",
             "| --- | --- | --- | --- | --- | --- |"]
    for ph, row in res["phases"].items():
        c, t = row["cake"], row["torch"]
        cells = [f"{c['ms']:.3f}" if "ms" in c else c.get("error", "?"),
                 f"{c['tflops']:.1f}" if "ms" in c else "",
                 f"{t['ms']:.3f}" if "ms" in t else t.get("error", "?"),
                 f"{t['tflops']:.1f}" if "ms" in t else "",
                 f"{row['ratio']:.2f}" if "ratio" in row else ""]
        lines.append(f"| {ph} | " + " | ".join(cells) + " |")
    if "rel_err" in res:
        errs = ", ".join(f"{k} {v:.2e}" for k, v in res["rel_err"].items())
        lines += ["", f"rel. error vs float64: {errs}; wgrad bitwise repeat: "
                      f"{res['wgrad_bitwise_repeat']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = parse_overrides(args.plan)
    import torch

    triton = bench.import_triton()  # cake picks CUDA or the interpreter first
    if bench.cuda_missing(args.device):
        return 2
    desc = bench.device_description(args.device)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    else:
        desc += ", Triton interpreter"
    shapes = args.shapes or (QUICK_CPU_SHAPES if args.device == "cpu" else DEFAULT_SHAPES)
    dtype = getattr(torch, DTYPES[args.dtype])
    timer = Timer(args.device, args.quick, args.warmup, args.rep, cpu_quick=(0, 1),
                  cpu_full=(1, 3))
    meta = {"date": bench.utc_now(),
            "device": desc, "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "dtype": args.dtype,
            "timer": timer.kind, "warmup": timer.warmup, "rep": timer.rep,
            "argv": sys.argv if argv is None else argv}
    print(f"## cake-dense-projection-det-gemm vs torch.matmul ({desc}, {args.dtype})\n",
          flush=True)
    payload: dict[str, Any] = {"meta": meta, "results": []}
    for M, N, K in shapes:
        try:
            res = run_shape(M, N, K, dtype, args.device, timer, not args.no_check, args.sweep,
                            overrides)
        except Exception as exc:  # noqa: BLE001 - e.g. OOM; recorded, next shape runs
            res = {"M": M, "N": N, "K": K, "status": "error",
                   "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"### M={M} N={N} K={K}: failed: {res['error']}\n", flush=True)
        else:
            print(markdown_shape(res) + "\n", flush=True)
        payload["results"].append(res)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(payload, f, indent=1)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0 if all(r.get("status") != "error" for r in payload["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
