"""Benchmark cake's deterministic LM-head loss (fused linear + cross entropy) against anchors.

Anchors: torch unfused (``F.cross_entropy((h @ W.T).float(), y)``, the whole logits in
memory), ``torch.compile`` of the same function, Liger-Kernel
(``LigerFusedLinearCrossEntropyFunction``) and FLA (``fused_linear_cross_entropy_loss``).
Each one is imported and run inside its own ``try``: a failing import or run (an
out-of-memory of the unfused anchor at 16384 x 151936, say) is recorded, not fatal.

Measured per shape (T tokens, H hidden, V vocabulary; bf16 by default) and implementation:
fwd+bwd time (a fresh forward, then ``torch.autograd.grad`` of the mean loss to hidden and
weight) and the peak memory above the inputs during that step (CUDA only). The first call
(compilation included) is timed separately. Ratios are cake_time / anchor_time (below 1:
cake faster) and cake_peak / anchor_peak.

Typical GPU run (anchor wheels installed with ``pip install --no-deps --target /tmp/site``)::

    PYTHONPATH=/tmp/site:$(ls -d packages/*/src | paste -sd:) python3 \\
        packages/cake-lm-head-loss-det-train/benchmarks/bench_cake_lm_head_loss_det_train.py \\
        --out $OUT/lm_head_loss_bench.json

CPU smoke test (perf_counter timer, CUDA-only anchors skipped, small default shapes)::

    python3 .../bench_cake_lm_head_loss_det_train.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from cake_core import bench
from cake_core.bench import dist_version

DEFAULT_SHAPES = [(t, 4096, v) for t in (4096, 16384) for v in (32000, 128256, 151936)]
CPU_QUICK_SHAPES = [(64, 32, 1000)]
ALL_IMPLS = ("cake", "torch_eager", "torch_compile", "liger", "fla", "cake_chunked")
NEEDS_CUDA = {"liger", "fla"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    return bench.parse_shapes(text, 3, "TxHxV, 1024x512x32000", strict=True)


def parse_impls(text: str) -> list[str]:
    return bench.parse_names(text, ALL_IMPLS, what="impls")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="comma-separated TxHxV (default: T in {4096, 16384}, H 4096, V in "
                   "{32000, 128256, 151936}; on the CPU 64x32x1000)")
    p.add_argument("--impls", type=parse_impls, default=list(ALL_IMPLS[:5]),
                   help="default: the first five; cake_chunked = cake with defer_dw_tokens=0 "
                        "(the chunked fp32 dweight sum even where the plan defers)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep ms (100)")
    p.add_argument("--no-check", action="store_true", help="skip the accuracy check")
    return p


def short_error(exc: BaseException) -> str:
    return bench.short_error(exc, 1500)


# ------------------------------------------------------------------------ implementations


def make_impl(name: str) -> tuple[Callable, str, str | None]:
    """(fn(h, w, y) -> mean loss, api description, version)."""
    import torch
    import torch.nn.functional as F

    if name == "cake":
        mod = importlib.import_module("cake_lm_head_loss_det_train")
        return (lambda h, w, y: mod.lm_head_loss_det(h, w, y),
                "cake_lm_head_loss_det_train.lm_head_loss_det(h, w, y)", mod.__version__)
    if name == "cake_chunked":
        import dataclasses

        mod = importlib.import_module("cake_lm_head_loss_det_train")

        def chunked(h, w, y):
            plan = dataclasses.replace(mod.make_plan(h.shape[-1], w.shape[0], h.dtype, h.device),
                                       defer_dw_tokens=0)
            return mod.lm_head_loss_det(h, w, y, plan=plan)
        return (chunked, "lm_head_loss_det(h, w, y, plan=<default, defer_dw_tokens=0>)",
                mod.__version__)
    if name in ("torch_eager", "torch_compile"):
        def unfused(h, w, y):
            return F.cross_entropy((h @ w.T).float(), y)
        if name == "torch_eager":
            return unfused, "F.cross_entropy((h @ w.T).float(), y)", torch.__version__
        return (torch.compile(unfused, dynamic=False),
                "torch.compile(F.cross_entropy((h @ w.T).float(), y))", torch.__version__)
    if name == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction,
        )

        def liger(h, w, y):
            out = LigerFusedLinearCrossEntropyFunction.apply(h, w, y)
            return out[0] if isinstance(out, tuple) else out
        return (liger, "LigerFusedLinearCrossEntropyFunction.apply(h, w, y)",
                dist_version("liger-kernel", "liger_kernel"))
    if name == "fla":
        from fla.modules.fused_linear_cross_entropy import fused_linear_cross_entropy_loss

        def fla(h, w, y):
            out = fused_linear_cross_entropy_loss(h, y, w)  # (x, target, weight, ...)
            return out[0] if isinstance(out, tuple) else out
        return (fla,
                "fla.modules.fused_linear_cross_entropy.fused_linear_cross_entropy_loss(h, y, w)",
                dist_version("fla-core", "flash-linear-attention"))
    raise ValueError(name)


# ------------------------------------------------------------------------ timing


def time_ms(fn: Callable[[], Any], device: str, quick: bool, warmup, rep) -> dict[str, float]:
    if device == "cuda":
        return bench.do_bench_ms(fn, warmup or (5 if quick else 25), rep or (20 if quick else 100))
    n_warm, n_rep = (1, 2) if quick else (2, 5)
    times = bench.time_calls(fn, n_warm, n_rep, "cpu")
    return {"ms": statistics.median(times), "p20_ms": min(times), "p80_ms": max(times)}


def run_shape(shape, args, impls) -> dict[str, Any]:
    import torch

    T, H, V = shape
    dtype = getattr(torch, DTYPES[args.dtype])
    dev = args.device
    g = torch.Generator(device="cpu").manual_seed(0)
    h = torch.randn(T, H, generator=g).to(dev, dtype).requires_grad_()
    w = (torch.randn(V, H, generator=g) * H ** -0.5).to(dev, dtype).requires_grad_()
    y = torch.randint(0, V, (T,), generator=g).to(dev)
    y[::13] = -100
    out: dict[str, Any] = {"T": T, "H": H, "V": V, "dtype": args.dtype, "impls": {}}
    ref = None
    if not args.no_check and T * V <= (1 << 31):
        try:  # fp32 unfused reference of loss and dhidden (chunked to bound its memory)
            hf, wf = h.detach().float().requires_grad_(), w.detach().float()
            loss = torch.nn.functional.cross_entropy(hf @ wf.T, y)
            (dh,) = torch.autograd.grad(loss, hf)
            ref = (loss.detach(), dh)
            del hf, wf, loss
        except Exception as exc:  # noqa: BLE001
            out["reference_error"] = short_error(exc)
    for name in impls:
        rec: dict[str, Any] = {}
        out["impls"][name] = rec
        if name in NEEDS_CUDA and dev != "cuda":
            rec["status"] = "skipped (needs CUDA)"
            continue
        try:
            fn, rec["api"], rec["version"] = make_impl(name)
            if name == "torch_compile":
                torch._dynamo.reset()

            def step(fn=fn):
                loss = fn(h, w, y)
                return loss, torch.autograd.grad(loss, (h, w))

            gc.collect()
            if dev == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            loss, (dh, dw) = step()
            if dev == "cuda":
                torch.cuda.synchronize()
                rec["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            rec["first_call_s"] = time.perf_counter() - t0
            if ref is not None:
                rec["loss_abs_err"] = abs(float(loss.detach()) - float(ref[0]))
                d = (dh.float() - ref[1]).norm() / ref[1].norm().clamp_min(1e-30)
                rec["dhidden_rel_err"] = float(d)
            del loss, dh, dw
            rec.update(time_ms(step, dev, args.quick, args.warmup, args.rep))
            rec["status"] = "ok"
        except BaseException as exc:  # noqa: BLE001 - record everything, keep going
            if isinstance(exc, KeyboardInterrupt):
                raise
            rec["status"] = "error"
            rec["error"] = short_error(exc)
            rec["traceback"] = bench.traceback_tail()
        finally:
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
    cake = out["impls"].get("cake", {})
    for name, rec in out["impls"].items():
        if name != "cake" and rec.get("status") == "ok" and cake.get("status") == "ok":
            rec["cake_time_ratio"] = cake["ms"] / rec["ms"]
            if "peak_extra_mib" in rec and rec["peak_extra_mib"] > 0:
                rec["cake_peak_ratio"] = cake["peak_extra_mib"] / rec["peak_extra_mib"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cpu":
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if bench.cuda_missing(args.device, "no CUDA device; use --device cpu"):
        return 2
    shapes = args.shapes or (DEFAULT_SHAPES if args.device == "cuda" else CPU_QUICK_SHAPES)
    if args.device == "cpu":
        args.dtype = "fp32" if args.dtype == "bf16" else args.dtype  # interpreter: fp32 math
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "triton": dist_version("triton")}
    results = {"env": env, "args": {k: v for k, v in vars(args).items() if k != "shapes"},
               "shapes": []}
    for shape in shapes:
        r = run_shape(shape, args, args.impls)
        results["shapes"].append(r)
        print(f"T={r['T']} H={r['H']} V={r['V']} {r['dtype']}")
        for name, rec in r["impls"].items():
            if rec.get("status") == "ok":
                mem = f"{rec['peak_extra_mib']:9.1f} MiB" if "peak_extra_mib" in rec \
                    else "      n/a"
                err = f" dh_err={rec['dhidden_rel_err']:.1e}" if "dhidden_rel_err" in rec \
                    else ""
                ratio = f" cake/x={rec['cake_time_ratio']:.2f}" if "cake_time_ratio" in rec \
                    else ""
                print(f"  {name:14s} {rec['ms']:10.3f} ms  peak {mem}{err}{ratio}")
            else:
                print(f"  {name:14s} {rec.get('status')}: {rec.get('error', '')[:200]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
