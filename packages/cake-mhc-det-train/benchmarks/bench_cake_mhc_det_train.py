"""Benchmark cake's deterministic mHC (prepare + finish) against Liger-Kernel's mHC kernels,
torch eager and torch.compile of the same math.

Phases, for X ``[T, n, C]`` and an identity branch (B = U, so only the mHC kernels are
timed):

- ``fwd``:     U, h = prepare(X); Y = finish(X, U, h)   (autograd enabled, no backward)
- ``fwd_bwd``: the same, then the gradients of X, phi, alpha and bias from dY
  (``torch.autograd.grad``, so nothing accumulates between repetitions)

Implementations: ``cake`` (``mhc_det_prepare`` / ``mhc_det_finish``, fp32 phi, the plan
``make_plan`` picks), ``liger`` (``liger_mhc_coeffs`` + ``liger_mhc_pre`` +
``liger_mhc_post_res`` from liger-kernel, when importable; phi in bf16, its tensor-core
path, and its default ``sinkhorn_eps=1e-6``), ``torch`` (the package's
``mhc_reference`` math in eager torch, fp32 coefficients) and ``torch.compile`` (the same
function compiled; inductor on CUDA).

Bandwidth roofline: compulsory bytes of X's dtype per token, in units of C elements:
fwd = prepare (read X: n, write U: 1) + finish (read X: n, read B: 1, write Y: n) = 3n + 2;
fwd_bwd adds the backward (read dY: n, X: n, B: 1, dU: 1; write dX: n, dB: 1) = 3n + 3,
so 6n + 5 in all. ``pct_roofline`` = bytes / time / peak (4.3 TB/s by default, an H200).

Checks (default on): each implementation's Y and gradients against cake's (relative
Frobenius difference, informational) and against a float64 reference on a token subset;
``bitwise_repeat``: the gradients of 5 identical fwd+bwd runs hashed, equal or not.

GPU run (one H200; T = 16384, n = 4, C in 2048, 4096, 7168, bf16)::

    cd packages/cake-mhc-det-train/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 bench_cake_mhc_det_train.py \\
        --out $OUT/mhc_bench.json

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_mhc_det_train.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cake_core import bench
from cake_core.bench import Timer

DEFAULT_T, DEFAULT_N, DEFAULT_C = 16384, 4, (2048, 4096, 7168)
QUICK_CPU = {"tokens": 24, "n": 4, "hidden": (16,)}
IMPLS = ("cake", "liger", "torch", "torch.compile")
PHASES = ("fwd", "fwd_bwd")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
PEAK_GBPS = 4300.0
REPEATS = 5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--tokens", type=int, default=None, help="T (16384)")
    p.add_argument("--streams", type=int, default=None, help="n (4)")
    p.add_argument("--hidden", type=bench.parse_ints, default=None,
                   help="C values (2048,4096,7168)")
    p.add_argument("--iters", type=int, default=20, help="Sinkhorn iterations (20)")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help="comma-separated subset of " + ", ".join(IMPLS))
    p.add_argument("--peak-gbps", type=float, default=PEAK_GBPS,
                   help="bandwidth roofline in GB/s (4300, an H200)")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--no-check", action="store_true", help="skip accuracy/repeat checks")
    return p


def compulsory_bytes(T: int, n: int, C: int, itemsize: int) -> dict[str, int]:
    unit = T * C * itemsize
    return {"fwd": (3 * n + 2) * unit, "fwd_bwd": (6 * n + 5) * unit}


def make_case(T: int, n: int, C: int, dtype, device: str, seed: int = 0) -> dict[str, Any]:
    import torch

    M = 2 * n + n * n
    g = torch.Generator(device=device).manual_seed(seed)
    X = torch.randn(T, n, C, device=device, dtype=dtype, generator=g)
    phi = torch.randn(n * C, M, device=device, generator=g) * (n * C) ** -0.5
    alpha = torch.tensor([0.8, 1.1, 1.3], device=device)
    bias = torch.randn(M, device=device, generator=g) * 0.5
    dY = torch.randn(T, n, C, device=device, dtype=dtype, generator=g)
    return {"X": X, "phi": phi, "alpha": alpha, "bias": bias, "dY": dY}


def make_impl(name: str, iters: int):
    """A function ``(X, phi, alpha, bias) -> Y`` (autograd-enabled) for implementation
    ``name``; raises (ImportError, ...) when it is unavailable."""
    import torch
    from cake_mhc_det_train import mhc_det_finish, mhc_det_prepare, mhc_reference

    if name == "cake":
        def cake(X, phi, alpha, bias):
            U, h = mhc_det_prepare(X, phi, alpha, bias, sinkhorn_iters=iters)
            return mhc_det_finish(X, U, h)
        return cake
    if name == "liger":
        from liger_kernel.transformers.functional import (
            liger_mhc_coeffs,
            liger_mhc_post_res,
            liger_mhc_pre,
        )

        def liger(X, phi, alpha, bias):
            h_pre, h_post, h_res = liger_mhc_coeffs(
                X, phi.to(torch.bfloat16) if X.dtype == torch.bfloat16 else phi, bias,
                alpha[0], alpha[1], alpha[2], allow_fp32=X.dtype == torch.float32,
                tmax=iters)
            U = liger_mhc_pre(X, h_pre)
            return liger_mhc_post_res(X, U, h_post, h_res)
        return liger

    def eager(X, phi, alpha, bias):
        return mhc_reference(X, phi, alpha, bias, lambda u: u, sinkhorn_iters=iters)

    if name == "torch":
        return eager
    if name == "torch.compile":
        return torch.compile(eager)
    raise ValueError(f"unknown implementation {name!r}")


def _grads(fn, case):
    import torch

    leaves = [case[k].detach().clone().requires_grad_() for k in ("X", "phi", "alpha",
                                                                  "bias")]
    Y = fn(*leaves)
    return Y, torch.autograd.grad(Y, leaves, case["dY"])


def run_case(T: int, n: int, C: int, dtype, device: str, iters: int, impls: dict[str, Any],
             timer: Timer, check: bool, peak_gbps: float) -> dict[str, Any]:
    import torch
    from cake_core.testing import rel_fro_error
    from cake_mhc_det_train import make_plan, mhc_reference

    case = make_case(T, n, C, dtype, device)
    res: dict[str, Any] = {"T": T, "n": n, "C": C, "iters": iters,
                           "plan": make_plan(n, C, dtype, device).to_dict(), "impls": {}}
    nbytes = compulsory_bytes(T, n, C, case["X"].element_size())
    res["bytes"] = nbytes
    leaves = {k: case[k].detach().clone().requires_grad_() for k in ("X", "phi", "alpha",
                                                                     "bias")}
    ref_out = None
    if check:
        Yc, gc_ = _grads(impls["cake"], case) if "cake" in impls else (None, None)
        ref_out = (Yc, gc_)
        sub = min(T, 256)
        small = {k: (case[k][:sub] if k in ("X", "dY") else case[k]) for k in case}
        lv = [small[k].detach().double().requires_grad_() for k in ("X", "phi", "alpha",
                                                                     "bias")]
        Yr = mhc_reference(*lv, lambda u: u, sinkhorn_iters=iters, dtype=torch.float64)
        gr = torch.autograd.grad(Yr, lv, small["dY"].double())
        res["ref_tokens"] = sub
    for name, fn in impls.items():
        rec: dict[str, Any] = {}
        try:
            if check:
                Y, g = _grads(fn, case)
                if ref_out is not None and ref_out[0] is not None and name != "cake":
                    rec["rel_diff_vs_cake"] = {
                        k: rel_fro_error(a, b) for k, a, b in
                        zip(("Y", "dX", "dphi", "dalpha", "dbias"), (Y, *g),
                            (ref_out[0], *ref_out[1]), strict=True)}
                small_case = {k: (case[k][:sub] if k in ("X", "dY") else case[k])
                              for k in case}
                Ys, gs = _grads(fn, small_case)
                rec["rel_err_vs_fp64"] = {
                    k: rel_fro_error(a, b) for k, a, b in
                    zip(("Y", "dX", "dphi", "dalpha", "dbias"), (Ys, *gs), (Yr, *gr),
                        strict=True)}
                hashes = [bench.bits_sha256(_grads(fn, case)[1]) for _ in range(REPEATS)]
                rec["bitwise_repeat"] = len(set(hashes)) == 1
                rec["distinct_grad_hashes"] = len(set(hashes))
                del Y, g
            rec["fwd"] = timer.bench(lambda fn=fn: fn(*leaves.values()))
            rec["fwd_bwd"] = timer.bench(
                lambda fn=fn: torch.autograd.grad(fn(*leaves.values()), list(leaves.values()),
                                                  case["dY"]))
            bench.add_bandwidth(rec, nbytes, peak_gbps, PHASES)
            for ph in PHASES:
                rec[ph]["pct_roofline"] = rec[ph].pop("pct_peak")
        except Exception as exc:  # noqa: BLE001 - recorded, the next implementation runs
            rec.update(bench.error_record(exc))
        res["impls"][name] = rec
        timer.sync()
    res["ratios"] = bench.cake_ratios(res["impls"], [i for i in impls if i != "cake"], PHASES)
    return res


def markdown_case(res: dict[str, Any]) -> str:
    lines = [f"### T={res['T']} n={res['n']} C={res['C']} ({res['iters']} Sinkhorn "
             "iterations)", "",
             "| impl | fwd ms | fwd % roofline | fwd+bwd ms | fwd+bwd % roofline | "
             "cake/impl fwd+bwd | grads bitwise x5 |", "|" + " --- |" * 7]
    for name, rec in res["impls"].items():
        if "error" in rec:
            lines.append(f"| {name} | {rec['error'][:100]} | | | | | |")
            continue
        r = res["ratios"].get(name, {}).get("fwd_bwd")
        lines.append(
            f"| {name} | {rec['fwd']['ms']:.3f} | {rec['fwd']['pct_roofline']:.1f} | "
            f"{rec['fwd_bwd']['ms']:.3f} | {rec['fwd_bwd']['pct_roofline']:.1f} | "
            f"{bench.fmt(r, '.2f')} | {rec.get('bitwise_repeat', '—')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    triton = bench.import_triton()  # cake picks CUDA or the interpreter first
    if bench.cuda_missing(args.device):
        return 2
    desc = bench.device_description(args.device)
    cpu = args.device == "cpu"
    if cpu:
        desc += ", Triton interpreter"
    T = args.tokens or (QUICK_CPU["tokens"] if cpu else DEFAULT_T)
    n = args.streams or (QUICK_CPU["n"] if cpu else DEFAULT_N)
    hidden = args.hidden or (QUICK_CPU["hidden"] if cpu else DEFAULT_C)
    names = [s for s in args.impls.split(",") if s]
    for s in names:
        if s not in IMPLS:
            print(f"--impls: unknown {s!r}", file=sys.stderr)
            return 2
    if cpu and "liger" in names:
        names.remove("liger")  # Liger's kernels are CUDA-only
    impls = bench.load_impls(names, lambda s: make_impl(s, args.iters))
    dtype = getattr(torch, DTYPES[args.dtype])
    timer = Timer(args.device, args.quick, args.warmup, args.rep, cpu_quick=(0, 1),
                  cpu_full=(1, 3))
    meta = {"date": bench.utc_now(), "device": desc, "python": sys.version.split()[0],
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "liger_kernel": bench.dist_version("liger-kernel",
                                                                              "liger_kernel"),
            "dtype": args.dtype, "tokens": T, "streams": n, "iters": args.iters,
            "peak_gbps": args.peak_gbps, "impls": list(impls), "timer": timer.kind,
            "warmup": timer.warmup, "rep": timer.rep,
            "argv": sys.argv if argv is None else argv}
    print(f"## cake-mhc-det-train vs {', '.join(i for i in impls if i != 'cake')} "
          f"({desc}, {args.dtype})\n", flush=True)
    payload: dict[str, Any] = {"meta": meta, "results": []}
    for C in hidden:
        try:
            res = run_case(T, n, C, dtype, args.device, args.iters, impls, timer,
                           not args.no_check, args.peak_gbps)
        except Exception as exc:  # noqa: BLE001 - e.g. OOM; recorded, the next case runs
            res = {"T": T, "n": n, "C": C, **bench.error_record(exc)}
            print(f"### C={C}: failed: {res['error']}\n", flush=True)
        else:
            print(markdown_case(res) + "\n", flush=True)
        payload["results"].append(res)
        bench.write_json(args.out, payload)
        bench.free_memory(args.device)
    ok = all(r.get("status") != "error" and all("error" not in v for k, v in
                                                 r["impls"].items() if k == "cake")
             for r in payload["results"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
