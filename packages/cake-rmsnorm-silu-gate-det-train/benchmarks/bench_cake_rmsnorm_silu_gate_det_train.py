"""Benchmark cake's deterministic gated RMSNorm (forward, forward+backward) against anchors.

Anchors, each imported and run inside its own ``try`` (a failure is recorded, not fatal):

- ``fla``: FLA's ``rms_norm_gated(x, z, weight, None, activation=..., eps=eps)`` (what
  ``FusedRMSNormGated`` calls), norm-before-gate order only;
- ``mamba``: ``mamba_ssm.ops.triton.layernorm_gated.rmsnorm_fn`` (Mamba2's RMSNormGated),
  both orders, SiLU gate only;
- ``torch_compile``: ``torch.compile`` of cake's plain-torch reference (fp32 math, output
  cast to x's dtype), both orders.

Shapes are rows x D with rows = tokens x value heads, as Qwen3-Next's gated DeltaNet output
norm ([T*HV, 128]); the defaults are T=16384, HV=32 -> 524288x128 and 1048576x128, bf16.
``--activation sigmoid`` times Kimi Delta Attention's gate (cake, fla, torch_compile).

Typical GPU run (anchor wheels installed with ``pip install --no-deps --target /tmp/site``)::

    cd packages/cake-rmsnorm-silu-gate-det-train/benchmarks
    PYTHONPATH=/tmp/site:$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_rmsnorm_silu_gate_det_train.py --out $OUT/rmsnorm_silu_gate_bench.json

CPU smoke test (perf_counter, CUDA-only anchors skipped; the interpreter is slow)::

    python3 .../bench_cake_rmsnorm_silu_gate_det_train.py --device cpu --shapes 256x128 \\
        --impls cake,torch_compile --warmup 1 --rep 2

Timing on CUDA: CUDA events around each call (``--warmup`` calls first, then ``--rep`` timed
calls), the median in ms (p20/p80 kept in the JSON); no L2 flush (each tensor of the default
shapes is at least 128 MiB, above the 50 MiB L2). Forward runs with inputs that require grad
(a training forward); forward+backward is a fresh forward plus
``torch.autograd.grad(y, (x, z, w), dy)``. Bytes model (element size ``elt``, N = rows*D):
fwd = 3*N*elt (read x, z; write y), f+b = 8*N*elt (fwd, then read x, z, dy; write dx, dz);
weight, rstd and dweight traffic are ignored. GB/s = bytes / median time; %peak against
``--peak-gbps`` (default 4300 GB/s, the HBM figure the other cake benchmarks use). Ratios
are cake_time / anchor_time: below 1, cake is faster.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

from cake_core import bench
from cake_core.bench import (
    dist_version,
    err_stats,
    fmt,
    free_memory,
    short_error,
    traceback_tail,
    write_json,
)

DEFAULT_SHAPES = ((524288, 128), (1048576, 128))
ALL_IMPLS = ("cake", "fla", "mamba", "torch_compile")
ANCHORS = ("fla", "mamba", "torch_compile")
NEEDS_CUDA = {"fla", "mamba"}
ORDERS = {"fla": True, "mamba": False}  # order name -> norm_before_gate
PHASES = ("fwd", "fwdbwd")
PHASE_LABEL = {"fwd": "fwd", "fwdbwd": "f+b"}
PHASE_BYTES = {"fwd": 3, "fwdbwd": 8}  # in units of N*elt
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# ------------------------------------------------------------------------------- arguments


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return bench.parse_shapes(text, 2, "ROWSxD, e.g. 1024x128")


def _parse_list(known: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        return bench.parse_names(text, known, allow_empty=False)

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--shapes", type=parse_shapes, default=list(DEFAULT_SHAPES),
                   help="comma-separated ROWSxD list (default: 524288x128,1048576x128)")
    p.add_argument("--impls", type=_parse_list(ALL_IMPLS), default=list(ALL_IMPLS),
                   help=f"comma-separated subset of {','.join(ALL_IMPLS)} (default: all)")
    p.add_argument("--orders", type=_parse_list(tuple(ORDERS)), default=list(ORDERS),
                   help="gate orders: fla (norm before gate), mamba (gate before norm)")
    p.add_argument("--group-size", type=int, default=None, help="G (default: D, no groups)")
    p.add_argument("--activation", choices=("silu", "sigmoid"), default="silu",
                   help="the gate (FLA's names; 'swish' is 'silu')")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first")
    p.add_argument("--rep", type=int, default=50, help="timed calls (median reported)")
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="bandwidth for %% of peak")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip accuracy/repeat checks")
    return p


# ------------------------------------------------------------------------------- helpers


def time_ms(fn: Callable[[], Any], device: str, warmup: int, rep: int) -> dict[str, float]:
    """Median / p20 / p80 ms of ``fn`` over ``rep`` calls after ``warmup`` calls (CUDA
    events recorded back to back, one wait at the end; perf_counter on the CPU)."""
    return bench.summarize_ms(bench.time_calls(fn, max(warmup, 0), max(rep, 1), device))


# ------------------------------------------------------------------------------- implementations


def load_impls(names: list[str]) -> dict[str, dict[str, Any]]:
    """name -> {"make": make(norm_before_gate, G, eps, activation) -> fn(x, z, w) | None,
    "version", "api"} or {"error": ...}."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            if name == "cake":
                mod = importlib.import_module("cake_rmsnorm_silu_gate_det_train")
                f = mod.rmsnorm_silu_gate_det

                def make(nbg, G, eps, act, f=f):
                    return lambda x, z, w: f(x, z, w, eps, norm_before_gate=nbg, group_size=G,
                                             activation=act)

                out[name] = {"make": make, "version": mod.__version__,
                             "api": "rmsnorm_silu_gate_det(x, z, w, eps, norm_before_gate, "
                                    "group_size, activation)"}
            elif name == "fla":
                try:
                    mod = importlib.import_module("fla.modules.norm.fused_norm_gate")
                except ModuleNotFoundError:
                    mod = importlib.import_module("fla.modules.fused_norm_gate")
                f = mod.rms_norm_gated
                _ = mod.FusedRMSNormGated  # the module calls rms_norm_gated

                def make(nbg, G, eps, act, f=f):
                    if not nbg or G is not None:
                        return None  # FLA has the norm-before-gate order only, no groups
                    return lambda x, z, w: f(x, z, w, None, activation=act, eps=eps)

                out[name] = {"make": make, "version": dist_version("fla-core", "fla"),
                             "api": f"{mod.__name__}.rms_norm_gated(x, z, w, None, "
                                    "activation=activation, eps=eps)"}
            elif name == "mamba":
                mod = importlib.import_module("mamba_ssm.ops.triton.layernorm_gated")
                f = mod.rmsnorm_fn

                def make(nbg, G, eps, act, f=f):
                    if act != "silu":
                        return None  # Mamba's gated norm has the SiLU gate only
                    return lambda x, z, w: f(x, w, None, z=z, eps=eps, group_size=G,
                                             norm_before_gate=nbg)

                out[name] = {"make": make, "version": dist_version("mamba-ssm", "mamba_ssm"),
                             "api": f"{mod.__name__}.rmsnorm_fn(x, w, None, z=z, eps=eps, "
                                    "group_size=G, norm_before_gate=...)"}
            elif name == "torch_compile":
                ref = importlib.import_module(
                    "cake_rmsnorm_silu_gate_det_train.reference").rmsnorm_silu_gate_reference

                def make(nbg, G, eps, act, ref=ref):
                    def eager(x, z, w):
                        return ref(x, z, w, eps, norm_before_gate=nbg, group_size=G,
                                   activation=act, dtype=torch.float32).to(x.dtype)

                    return torch.compile(eager, dynamic=False)

                out[name] = {"make": make, "version": torch.__version__,
                             "api": "torch.compile(rmsnorm_silu_gate_reference(..., "
                                    "dtype=float32).to(x.dtype), dynamic=False)"}
        except BaseException as exc:  # noqa: BLE001 - record everything, keep going
            if isinstance(exc, KeyboardInterrupt):
                raise
            out[name] = {"error": short_error(exc), "traceback": traceback_tail()}
    return out


# ------------------------------------------------------------------------------- one case


def run_impl(fn, x, z, w, dy, ref, args) -> dict[str, Any]:
    import torch

    grad = torch.autograd.grad
    rec: dict[str, Any] = {"status": "ok"}
    if args.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    y = fn(x, z, w)
    g = grad(y, (x, z, w), dy)
    if args.device == "cuda":
        torch.cuda.synchronize()
    rec["first_call_s"] = time.perf_counter() - t0
    if ref is not None:
        rec["err_vs_fp32_ref"] = {k: err_stats(a, b)
                                  for k, a, b in zip(("y", "dx", "dz", "dw"), (y, *g), ref,
                                                     strict=True)}
        y2 = fn(x, z, w)
        g2 = grad(y2, (x, z, w), dy)
        rec["bitwise_repeat"] = {k: bool(torch.equal(a, b)) for k, a, b in
                                 zip(("y", "dx", "dz", "dw"), (y, *g), (y2, *g2), strict=True)}
        del y2, g2
    del y, g
    rec["fwd"] = time_ms(lambda: fn(x, z, w), args.device, args.warmup, args.rep)

    def fwd_bwd():
        return grad(fn(x, z, w), (x, z, w), dy)

    rec["fwdbwd"] = time_ms(fwd_bwd, args.device, args.warmup, args.rep)
    return rec


def run_case(rows: int, D: int, order: str, impls, args) -> dict[str, Any]:
    import torch

    nbg = ORDERS[order]
    G = args.group_size
    dtype = getattr(torch, DTYPES[args.dtype])
    elt = torch.empty((), dtype=dtype).element_size()
    n = rows * D
    bytes_ = {ph: PHASE_BYTES[ph] * n * elt for ph in PHASES}
    res: dict[str, Any] = {"rows": rows, "D": D, "order": order, "norm_before_gate": nbg,
                           "group_size": G, "activation": args.activation, "dtype": args.dtype,
                           "bytes": bytes_, "impls": {}}
    gen = torch.Generator(device=args.device).manual_seed(args.seed + rows + D)
    x = torch.randn(rows, D, device=args.device, dtype=dtype, generator=gen).requires_grad_()
    z = (3 * torch.randn(rows, D, device=args.device, generator=gen)).to(dtype).requires_grad_()
    w = (1.0 + 0.1 * torch.randn(D, device=args.device, generator=gen)).to(dtype)
    w.requires_grad_()
    dy = torch.randn(rows, D, device=args.device, dtype=dtype, generator=gen)
    ref = None
    if not args.no_check:
        from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_reference

        leaves = [t.detach().float().requires_grad_() for t in (x, z, w)]
        yr = rmsnorm_silu_gate_reference(*leaves, args.eps, norm_before_gate=nbg, group_size=G,
                                         activation=args.activation, dtype=torch.float32)
        ref = (yr.detach(), *torch.autograd.grad(yr, leaves, dy.float()))
        del yr, leaves

    for name in args.impls:
        info = impls[name]
        if "error" in info:
            res["impls"][name] = {"status": "import_error", "error": info["error"]}
            continue
        if args.device != "cuda" and name in NEEDS_CUDA:
            res["impls"][name] = {"status": "skipped", "error": "needs CUDA"}
            continue
        if name == "torch_compile":
            torch._dynamo.reset()
        try:
            fn = info["make"](nbg, G, args.eps, args.activation)
            if fn is None:
                res["impls"][name] = {"status": "skipped",
                                      "error": "order/groups/activation not supported"}
                continue
            rec = run_impl(fn, x, z, w, dy, ref, args)
        except BaseException as exc:  # noqa: BLE001 - one failing impl must not kill the run
            if isinstance(exc, KeyboardInterrupt):
                raise
            rec = bench.error_record(exc)
        free_memory(args.device)
        bench.add_bandwidth(rec, bytes_, args.peak_gbps, PHASES)
        res["impls"][name] = rec

    res["ratio_cake_over_anchor"] = bench.cake_ratios(res["impls"], ANCHORS, PHASES)
    del x, z, w, dy, ref
    free_memory(args.device)
    return res


# ------------------------------------------------------------------------------- report


def markdown_case(res: dict[str, Any]) -> str:
    head = [f"### rows={res['rows']} D={res['D']} {res['dtype']} order={res['order']} "
            f"group_size={res['group_size']} activation={res['activation']}", ""]
    cols = ["impl"]
    for ph in PHASES:
        lab = PHASE_LABEL[ph]
        cols += [f"{lab} ms", f"{lab} GB/s", f"{lab} %peak"]
    cols += ["first call s"] + [f"cake/x {PHASE_LABEL[ph]}" for ph in PHASES] + \
        ["bitwise repeat", "max rel err y/dx/dz/dw"]
    lines = ["| " + " | ".join(cols) + " |", "|---" + "|---:" * (len(cols) - 1) + "|"]
    notes = []
    ratios = res.get("ratio_cake_over_anchor", {})
    for name, rec in res["impls"].items():
        if rec.get("status") != "ok":
            notes.append(f"- {name}: {rec.get('status')}: {rec.get('error', '')[:300]}")
            continue
        row = [name]
        for ph in PHASES:
            p = rec[ph]
            row += [fmt(p["ms"], ".4f"), fmt(p["gbps"], ".0f"), fmt(p["pct_peak"], ".1f")]
        row.append(fmt(rec.get("first_call_s"), ".2f"))
        r = ratios.get(name)
        row += [fmt(r.get(ph) if r else None, ".3f") for ph in PHASES]
        rep = rec.get("bitwise_repeat")
        row.append("—" if rep is None else ("yes" if all(rep.values()) else
                                             "no: " + ",".join(k for k, v in rep.items()
                                                               if not v)))
        e = rec.get("err_vs_fp32_ref")
        row.append("—" if e is None else "/".join(f"{e[k]['max_rel_to_max']:.1e}"
                                                  for k in ("y", "dx", "dz", "dw")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(head + lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    triton = bench.import_triton()  # after cake chose CUDA or the interpreter
    if bench.cuda_missing(args.device):
        return 2
    impls = load_impls(args.impls)
    meta = {
        "date": bench.utc_now(), "device": bench.device_description(args.device),
        "python": sys.version.split()[0], "torch": torch.__version__,
        "cuda": torch.version.cuda, "triton": triton.__version__,
        "versions": {n: i.get("version") for n, i in impls.items()},
        "apis": {n: i.get("api") for n, i in impls.items()},
        "import_errors": {n: i["error"] for n, i in impls.items() if "error" in i},
        "timer": "CUDA events per call, median" if args.device == "cuda" else "perf_counter",
        "warmup": args.warmup, "rep": args.rep, "peak_gbps": args.peak_gbps, "eps": args.eps,
        "bytes": "fwd 3*N*elt, f+b 8*N*elt; cake/x < 1 means cake is faster",
        "argv": sys.argv if argv is None else argv,
    }
    print("## cake rmsnorm_silu_gate_det benchmark\n")
    for k in ("date", "device", "torch", "cuda", "triton", "versions", "timer", "bytes"):
        print(f"- {k}: {meta[k]}")
    for n, e in meta["import_errors"].items():
        print(f"- import error {n}: {e[:300]}")
    print(flush=True)
    payload: dict[str, Any] = {"meta": meta, "results": []}
    for rows, D in args.shapes:
        for order in args.orders:
            try:
                res = run_case(rows, D, order, impls, args)
            except BaseException as exc:  # noqa: BLE001 - e.g. OOM allocating the inputs
                if isinstance(exc, KeyboardInterrupt):
                    raise
                res = {"rows": rows, "D": D, "order": order, "status": "error",
                       "error": short_error(exc), "traceback": traceback_tail()}
                free_memory(args.device)
                print(f"### rows={rows} D={D} order={order}: failed: {res['error']}\n",
                      flush=True)
            else:
                print(markdown_case(res) + "\n", flush=True)
            payload["results"].append(res)
            write_json(args.out, payload)  # after every case, so a timeout keeps what was done
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
