"""Benchmark cake-causal-conv1d-nondet-train against its det sibling, side by side in one run.

Implementations: ``det`` (``cake_causal_conv1d_det_train.causal_conv1d_det``) and
``nondet`` (``cake_causal_conv1d_nondet_train.causal_conv1d_nondet``), on the same inputs.
Cases (bf16, W = 4, SiLU; the det benchmark's shapes):

* ``a``: B=4, T=4096, D=4096 (fixed length)
* ``b``: B=1, T=32768 packed as 8 documents (random cut points, seed 0), D=8192
* ``tiny``: B=1, T=96 as 3 documents, D=64 (a CPU smoke test through Triton's interpreter)

Per case and implementation: forward and forward+backward (inputs requiring grad, a fixed
dy), each the median of CUDA-event times over ``--reps`` runs after ``--warmup`` runs
(``time.perf_counter`` on the CPU), det and nondet in turn for ``--rounds`` rounds (the
median of the rounds kept). ``ratio_nondet_over_det`` below 1: nondet faster.
``--check``: the nondet outputs and gradients against det's (max relative difference) and
whether two nondet runs gave the same bits (reported, not promised).

    B=packages/cake-causal-conv1d-nondet-train/benchmarks
    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 \\
        $B/bench_cake_causal_conv1d_nondet_train.py --check --out $OUT/conv_nondet.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from cake_core import bench

CASES = {
    "a": dict(B=4, T=4096, D=4096, docs=None),
    "b": dict(B=1, T=32768, D=8192, docs=8),
    "tiny": dict(B=1, T=96, D=64, docs=3),
}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="a,b", help=f"comma list of {','.join(CASES)} (a,b)")
    p.add_argument("--width", "-W", type=int, default=4, help="kernel size W (4)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3,
                   help="det / nondet timed in turn this many rounds, the median kept")
    return p


def make_case(torch, B, T, D, docs, W, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    cu = None
    if docs:
        cuts = torch.randperm(T - 1, generator=gen)[: docs - 1].add(1).sort().values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(device, torch.int32)
    return dict(x=rn(B, T, D), weight=rn(D, W, scale=0.5), bias=rn(D), dy=rn(B, T, D), cu=cu)


def main(argv=None) -> int:
    import torch
    from cake_causal_conv1d_det_train import causal_conv1d_det
    from cake_causal_conv1d_nondet_train import causal_conv1d_nondet

    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu (with --cases tiny)")
        return 2
    dtype = getattr(torch, DTYPES[args.dtype])
    impls = {"det": causal_conv1d_det, "nondet": causal_conv1d_nondet}
    results = {"args": vars(args), "torch": torch.__version__,
               "device": bench.device_description(args.device), "cases": {}}
    for cname in [c for c in args.cases.split(",") if c]:
        spec = CASES[cname]
        case = make_case(torch, **spec, W=args.width, dtype=dtype, device=args.device,
                         seed=args.seed)
        rows, outs, steps = {}, {}, {}
        for name, fn in impls.items():
            row = rows[name] = {}

            def step(fn=fn, case=case, backward=True):
                x, w, b = (case[k].detach().clone().requires_grad_()
                           for k in ("x", "weight", "bias"))
                y, _ = fn(x, w, b, activation="silu", cu_seqlens=case["cu"])
                if not backward:
                    return [y]
                y.backward(case["dy"])
                return [y.detach(), x.grad, w.grad, b.grad]

            try:
                steps[name] = step
                if args.check:
                    outs[name] = step()
                    if name == "nondet":
                        row["repeat_bitwise"] = all(
                            torch.equal(a, b) for a, b in zip(outs[name], step(), strict=True))
            except Exception as e:  # noqa: BLE001 - record and keep going
                row["error"] = bench.short_error(e)
        if len(steps) == len(impls):  # det and nondet in turn, each round, medians kept
            times = {name: {"fwd": [], "fwdbwd": []} for name in steps}
            for _ in range(max(1, args.rounds)):
                for name, step in steps.items():
                    times[name]["fwd"].append(statistics.median(bench.time_calls(
                        lambda step=step: step(backward=False), args.warmup, args.reps,
                        args.device, sync_each=True)))
                    times[name]["fwdbwd"].append(statistics.median(bench.time_calls(
                        step, args.warmup, args.reps, args.device, sync_each=True)))
            for name, t in times.items():
                rows[name]["fwd_ms"] = statistics.median(t["fwd"])
                rows[name]["fwdbwd_ms"] = statistics.median(t["fwdbwd"])
        if all("fwd_ms" in r for r in rows.values()):
            for ph in ("fwd", "fwdbwd"):
                rows["nondet"][f"{ph}_ratio_nondet_over_det"] = \
                    rows["nondet"][f"{ph}_ms"] / rows["det"][f"{ph}_ms"]
        if len(outs) == 2:
            rows["nondet"]["max_rel_diff_vs_det"] = [
                bench.max_rel_error(a, r, torch.float32)
                for a, r in zip(outs["nondet"], outs["det"], strict=True)]
        results["cases"][cname] = {"shape": spec, "impls": rows}
        print(f"case {cname} {spec}: {json.dumps(rows)}")
    bench.write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
