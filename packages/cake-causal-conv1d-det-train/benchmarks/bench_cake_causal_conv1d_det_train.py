"""Benchmark cake's deterministic causal conv1d against FLA and torch, side by side in one run.

Implementations (each imported and run inside its own ``try``: a failure is recorded, not
fatal):

* ``cake``: ``cake_causal_conv1d_det_train.causal_conv1d_det``.
* ``fla``: FLA's Triton ``causal_conv1d`` (``fla.modules.convolution`` in fla-core >= 0.5, an
  alias of ``fla.modules.causal_conv1d``; its ``ShortConvolution`` calls it), backend
  "triton". FLA's state is ``[N, D, W]`` (slot 0 unused): ``--state`` passes cake's
  ``[N, D, W - 1]`` state left-padded with a zero slot.
* ``torch``: ``F.conv1d(x^T, weight[D, 1, W], bias, padding=W - 1, groups=D)[..., :T]`` then
  SiLU, eager. It does not see document boundaries (packed case: a lower bound, not the same
  math) nor states.

Cases (bf16, W=4, SiLU by default; the issue's shapes):

* ``a``: B=4, T=4096, D=4096 (fixed length)
* ``b``: B=1, T=32768 packed as 8 documents (``cu_seqlens``, random cut points, seed 0),
  D=8192
* ``tiny``: B=1, T=96 as 3 documents, D=64 (a CPU smoke test through Triton's interpreter)

Per case and implementation: forward (inputs requiring grad, as in training) and
forward+backward (``torch.autograd.backward`` of y with a fixed dy), each the median of
CUDA-event times over ``--reps`` runs after ``--warmup`` runs (``time.perf_counter`` on the
CPU). Ratios are cake / anchor (below 1: cake faster). Bytes model (what any implementation
must move): forward 2 * B*T*D * elt (read x, write y), forward+backward 5 * B*T*D * elt
(+ read x and dy, write dx); weights, states and dweight partials are ignored. GB/s and
% of ``--peak-gbps`` (H200 HBM3e: 4300 GB/s by default) follow from it.

``--check`` compares every implementation's y and gradients with cake's (max |diff| /
max |cake|) and checks that two cake runs give the same bits.

    PYTHONPATH=$(ls -d packages/*/src | paste -sd:) python3 \\
        packages/cake-causal-conv1d-det-train/benchmarks/bench_cake_causal_conv1d_det_train.py \\
        --check --out $OUT/causal_conv1d_bench.json
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
IMPLS = ("cake", "fla", "torch")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="a,b", help=f"comma list of {','.join(CASES)} (a,b)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma list of cake,fla,torch")
    p.add_argument("--width", "-W", type=int, default=4, help="kernel size W (4)")
    p.add_argument("--activation", choices=("silu", "none"), default="silu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--bias", action="store_true", help="with a bias")
    p.add_argument("--state", action="store_true",
                   help="with an initial state and output_final_state (cake, fla)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="HBM bandwidth for %% of peak")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--check", action="store_true", help="compare outputs and gradients, and "
                   "check that cake repeats bit for bit")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    return p


def make_case(torch, B, T, D, docs, W, dtype, device, seed, state):
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    cu = None
    if docs:
        cuts = torch.randperm(T - 1, generator=gen)[: docs - 1].add(1).sort().values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(device, torch.int32)
    N = B if cu is None else docs
    return dict(x=rn(B, T, D), weight=rn(D, W, scale=0.5), bias=rn(D), dy=rn(B, T, D),
                h0=rn(N, D, W - 1) if state else None, cu=cu)


# ----------------------------------------------------------------------------- implementations


def impl_cake(act, with_bias, state):
    from cake_causal_conv1d_det_train import causal_conv1d_det

    def run(x, weight, bias, h0, cu):
        y, _ = causal_conv1d_det(x, weight, bias if with_bias else None, activation=act,
                                 cu_seqlens=cu, initial_state=h0, output_final_state=state)
        return y
    return run


def impl_fla(act, with_bias, state):
    try:
        from fla.modules.convolution import causal_conv1d
    except ImportError:
        from fla.modules.causal_conv1d import causal_conv1d

    def run(x, weight, bias, h0, cu):
        cache = None
        if h0 is not None:  # FLA keeps [N, D, W]; slot 0 is never read
            cache = torch_mod().nn.functional.pad(h0, (1, 0))
        y, _ = causal_conv1d(x, weight, bias if with_bias else None, initial_state=cache,
                             output_final_state=state, activation=act, backend="triton",
                             cu_seqlens=cu)
        return y
    return run


def impl_torch(act, with_bias, state):
    F = torch_mod().nn.functional

    def run(x, weight, bias, h0, cu):
        D, W = weight.shape
        y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias if with_bias else None,
                     padding=W - 1, groups=D)[..., : x.shape[1]].transpose(1, 2)
        return F.silu(y) if act else y
    return run


_TORCH = None


def torch_mod():
    global _TORCH
    if _TORCH is None:
        import torch

        _TORCH = torch
    return _TORCH


MAKERS = {"cake": impl_cake, "fla": impl_fla, "torch": impl_torch}


# ----------------------------------------------------------------------------- timing


def timed(fn, warmup, reps, device):
    """Median ms of ``reps`` calls (each waited for) after ``warmup`` calls."""
    return statistics.median(bench.time_calls(fn, warmup, reps, device, sync_each=True))


def leaves(case):
    x = case["x"].detach().clone().requires_grad_()
    w = case["weight"].detach().clone().requires_grad_()
    b = case["bias"].detach().clone().requires_grad_()
    h0 = case["h0"].detach().clone().requires_grad_() if case["h0"] is not None else None
    return x, w, b, h0


def run_once(run, case):
    x, w, b, h0 = leaves(case)
    y = run(x, w, b, h0, case["cu"])
    y.backward(case["dy"])
    grads = [x.grad, w.grad, b.grad] + ([h0.grad] if h0 is not None else [])
    return [y.detach()] + [g for g in grads if g is not None]  # db only with --bias


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    torch = torch_mod()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu (with --cases tiny)")
        return 2
    dtype = getattr(torch, DTYPES[args.dtype])
    act = "silu" if args.activation == "silu" else None
    impls = [s for s in args.impls.split(",") if s]
    results = {"args": vars(args), "torch": torch.__version__, "cases": {}}
    if args.device == "cuda":
        results["device"] = torch.cuda.get_device_name()
    for cname in [c for c in args.cases.split(",") if c]:
        spec = CASES[cname]
        case = make_case(torch, **spec, W=args.width, dtype=dtype, device=args.device,
                         seed=args.seed, state=args.state)
        elems = spec["B"] * spec["T"] * spec["D"]
        elt = torch.finfo(dtype).bits // 8
        rows = {}
        ref = None
        for name in impls:
            row = rows[name] = {}
            try:
                run = MAKERS[name](act, args.bias, args.state)
                if name == "torch" and args.state:
                    raise RuntimeError("torch anchor has no state")
                x, w, b, h0 = leaves(case)

                def fwd(run=run, x=x, w=w, b=b, h0=h0, cu=case["cu"]):
                    return run(x, w, b, h0, cu)

                def fwdbwd(run=run, case=case):
                    return run_once(run, case)

                row["fwd_ms"] = timed(fwd, args.warmup, args.reps, args.device)
                row["fwdbwd_ms"] = timed(fwdbwd, args.warmup, args.reps, args.device)
                for ph, mult in (("fwd", 2), ("fwdbwd", 5)):
                    gbps = mult * elems * elt / (row[f"{ph}_ms"] * 1e-3) / 1e9
                    row[f"{ph}_gbps"] = gbps
                    row[f"{ph}_pct_peak"] = 100.0 * gbps / args.peak_gbps
                if args.check:
                    out = run_once(run, case)
                    if name == "cake":
                        ref = out
                        again = run_once(run, case)
                        row["repeat_bitwise"] = all(torch.equal(a, b)
                                                    for a, b in zip(out, again, strict=True))
                    elif ref is not None:
                        row["max_rel_diff_vs_cake"] = [
                            bench.max_rel_error(a, r, torch.float32)
                            for a, r in zip(out, ref, strict=True)]
            except Exception as e:  # noqa: BLE001 - record and keep going
                row["error"] = f"{type(e).__name__}: {e}"[:500]
                row["traceback"] = bench.traceback_tail()
        if "cake" in rows and "fwd_ms" in rows["cake"]:
            for name, row in rows.items():
                if name != "cake" and "fwd_ms" in row:
                    for ph in ("fwd", "fwdbwd"):
                        row[f"{ph}_ratio_cake_over"] = rows["cake"][f"{ph}_ms"] / row[f"{ph}_ms"]
        results["cases"][cname] = {"shape": spec, "impls": rows}
        print(f"\ncase {cname}: B={spec['B']} T={spec['T']} D={spec['D']} docs={spec['docs']} "
              f"W={args.width} act={act} {args.dtype}")
        print(f"{'impl':8s} {'fwd ms':>9s} {'GB/s':>7s} {'%pk':>5s} {'f+b ms':>9s} {'GB/s':>7s} "
              f"{'%pk':>5s} {'cake/x fwd':>10s} {'cake/x f+b':>10s}")
        for name, row in rows.items():
            if "error" in row:
                print(f"{name:8s} ERROR {row['error']}")
                continue
            rf = row.get("fwd_ratio_cake_over")
            rb = row.get("fwdbwd_ratio_cake_over")
            print(f"{name:8s} {row['fwd_ms']:9.3f} {row['fwd_gbps']:7.0f} "
                  f"{row['fwd_pct_peak']:5.1f} {row['fwdbwd_ms']:9.3f} {row['fwdbwd_gbps']:7.0f} "
                  f"{row['fwdbwd_pct_peak']:5.1f} {'' if rf is None else f'{rf:10.2f}'} "
                  f"{'' if rb is None else f'{rb:10.2f}'}")
            if "repeat_bitwise" in row:
                print(f"         repeat bitwise: {row['repeat_bitwise']}")
            if "max_rel_diff_vs_cake" in row:
                diffs = ", ".join(f"{d:.1e}" for d in row["max_rel_diff_vs_cake"])
                print(f"         max rel diff vs cake (y, dx, dw[, db][, dh0]): {diffs}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
