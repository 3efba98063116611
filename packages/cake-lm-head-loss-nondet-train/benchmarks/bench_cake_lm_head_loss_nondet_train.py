"""Benchmark cake-lm-head-loss-nondet-train against its det sibling, side by side in one run.

Implementations: ``det`` (``cake_lm_head_loss_det_train.lm_head_loss_det``) and ``nondet``
(``cake_lm_head_loss_nondet_train.lm_head_loss_nondet``), on the same inputs (mean loss,
about one label in 16 ignored). Shapes ``TxHxV`` (bf16 by default): the det benchmark's
T in {4096, 16384} x H 4096 x V in {32000, 128256, 151936}; ``--quick`` on the CPU runs
64x32x1000 through Triton's interpreter (a smoke test).

Per shape and implementation: fwd+bwd time (a fresh forward, then ``torch.autograd.grad``
of the loss to hidden and weight), the median of CUDA-event times over ``--reps`` runs after
``--warmup`` runs (``time.perf_counter`` on the CPU), and on CUDA the peak memory above the
inputs. ``ratio_nondet_over_det`` below 1: nondet faster. ``--check``: the nondet loss and
gradients against det's (max relative difference) and whether two nondet runs gave the same
bits (reported, not promised).

    B=packages/cake-lm-head-loss-nondet-train/benchmarks
    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 \\
        $B/bench_cake_lm_head_loss_nondet_train.py --check --out $OUT/lm_head_loss_nondet.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from cake_core import bench

DEFAULT_SHAPES = [(t, 4096, v) for t in (4096, 16384) for v in (32000, 128256, 151936)]
CPU_QUICK_SHAPES = [(64, 32, 1000)]
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=None, help="comma list of TxHxV (the det benchmark's)")
    p.add_argument("--quick", action="store_true", help="the CPU smoke shape 64x32x1000")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None) -> int:
    import torch
    from cake_lm_head_loss_det_train import lm_head_loss_det
    from cake_lm_head_loss_nondet_train import lm_head_loss_nondet

    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --quick")
        return 2
    shapes = (bench.parse_shapes(args.shapes, 3, "TxHxV, 1024x512x32000", strict=True)
              if args.shapes else CPU_QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dtype = getattr(torch, DTYPES[args.dtype])
    if args.device == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # the interpreter's CPU path: fp32
    impls = {"det": lm_head_loss_det, "nondet": lm_head_loss_nondet}
    results = {"args": vars(args), "torch": torch.__version__,
               "device": bench.device_description(args.device), "shapes": {}}
    for T, H, V in shapes:
        gen = torch.Generator().manual_seed(args.seed)
        hidden = torch.randn(T, H, generator=gen).to(args.device, dtype)
        weight = (torch.randn(V, H, generator=gen) * H ** -0.5).to(args.device, dtype)
        labels = torch.randint(0, V, (T,), generator=gen)
        labels[::16] = -100
        labels = labels.to(args.device)
        rows, outs = {}, {}
        for name, fn in impls.items():
            row = rows[name] = {}

            def step(fn=fn, hidden=hidden, weight=weight, labels=labels):
                h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
                loss = fn(h, w, labels)
                return [loss.detach(), *torch.autograd.grad(loss, (h, w))]

            try:
                bench.free_memory(args.device)
                base = torch.cuda.memory_allocated() if args.device == "cuda" else 0
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                row["fwdbwd_ms"] = statistics.median(bench.time_calls(
                    step, args.warmup, args.reps, args.device, sync_each=True))
                if args.device == "cuda":
                    row["peak_mib_above_inputs"] = \
                        (torch.cuda.max_memory_allocated() - base) / 2**20
                if args.check:
                    outs[name] = step()
                    if name == "nondet":
                        row["repeat_bitwise"] = all(
                            torch.equal(a, b) for a, b in zip(outs[name], step(), strict=True))
            except Exception as e:  # noqa: BLE001 - record and keep going
                row["error"] = bench.short_error(e)
        if all("fwdbwd_ms" in r for r in rows.values()):
            rows["nondet"]["ratio_nondet_over_det"] = \
                rows["nondet"]["fwdbwd_ms"] / rows["det"]["fwdbwd_ms"]
        if len(outs) == 2:
            rows["nondet"]["max_rel_diff_vs_det"] = [
                bench.max_rel_error(a, r, torch.float32)
                for a, r in zip(outs["nondet"], outs["det"], strict=True)]
        results["shapes"][f"{T}x{H}x{V}"] = rows
        print(f"{T}x{H}x{V}: {json.dumps(rows)}")
    bench.write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
