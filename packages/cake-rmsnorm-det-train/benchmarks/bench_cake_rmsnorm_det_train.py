"""Benchmark cake's deterministic RMSNorm (forward, backward, forward+backward) against anchors.

Anchors: torch eager (``F.rms_norm``), ``torch.compile`` of the same function, Liger-Kernel
(``LigerRMSNormFunction``) and FLA (``fla.modules.norm.layernorm.rms_norm``). Each one is
imported and run inside its own ``try``: a failing import or run is recorded, not fatal.

Typical GPU run (anchor wheels installed with ``pip install --no-deps --target /tmp/site``)::

    PYTHONPATH=/tmp/site:$(ls -d packages/*/src | paste -sd:) python3 \\
        packages/cake-rmsnorm-det-train/benchmarks/bench_cake_rmsnorm_det_train.py \\
        --out $OUT/rmsnorm_bench.json

CPU smoke test (perf_counter timer, CUDA-only anchors skipped)::

    python3 .../bench_cake_rmsnorm_det_train.py --device cpu --shapes 256x128 --quick \\
        --impls cake,torch_eager

Timing on CUDA uses ``triton.testing.do_bench`` (warmup/rep in ms, L2 flushed before each
repetition) and reports the median (p20/p80 are kept in the JSON). Forward is timed with inputs
that require grad (a training forward); backward times ``torch.autograd.grad(y, (x, w), dy,
retain_graph=True)`` on a pre-built graph; forward+backward times a fresh forward plus that grad.
Bytes model: fwd = 2*T*H*elt (read x, write y), bwd = 3*T*H*elt (read x, dy, write dx),
fwd+bwd = 5*T*H*elt; weight, rstd and dw traffic are ignored. Ratios are cake_time / anchor_time,
so a value below 1 means cake is faster.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from cake_core import bench
from cake_core.bench import Timer, dist_version, fmt, free_memory, short_error, write_json
from cake_core.bench import traceback_tail as tb_tail

DEFAULT_SHAPES = ((32768, 4096), (16384, 8192), (65536, 2048))
ALL_IMPLS = ("cake", "torch_eager", "torch_compile", "liger", "fla")
ANCHORS = ("torch_eager", "torch_compile", "liger", "fla")
NEEDS_CUDA = {"liger", "fla"}
PHASES = ("fwd", "bwd", "fwdbwd")
PHASE_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "f+b"}
# Bytes moved per phase, in units of T*H*element_size.
PHASE_BYTES = {"fwd": 2, "bwd": 3, "fwdbwd": 5}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# --------------------------------------------------------------------------------------------
# argument parsing and environment
# --------------------------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return bench.parse_shapes(text, 2, "TxH, e.g. 1024x512")


def parse_impls(text: str) -> list[str]:
    return bench.parse_names(text, ALL_IMPLS, what="impls")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        default=list(DEFAULT_SHAPES),
        help="comma-separated TxH list (default: 32768x4096,16384x8192,65536x2048)",
    )
    p.add_argument(
        "--impls",
        type=parse_impls,
        default=list(ALL_IMPLS),
        help=f"comma-separated subset of {','.join(ALL_IMPLS)} (default: all)",
    )
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--peak-gbps", type=float, default=4300.0, help="bandwidth for %% of peak")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--keep-caches",
        action="store_true",
        help="reuse existing Triton/Inductor caches (default: fresh temp dirs, so the "
        "first-call time includes compilation)",
    )
    p.add_argument("--no-check", action="store_true", help="skip accuracy/repeat checks")
    p.add_argument(
        "--graph",
        action="store_true",
        help="also time fwd+bwd replayed from a CUDA graph (device time without host time)",
    )
    return p


def setup_fresh_caches(keep: bool) -> dict[str, str]:
    """Point Triton and Inductor at empty cache dirs (before either is imported; importing
    torch imports neither)."""
    if keep:
        return {}
    root = tempfile.mkdtemp(prefix="cake_rmsnorm_bench_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    dirs = {
        "TRITON_CACHE_DIR": os.path.join(root, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
    }
    for key, value in dirs.items():
        os.makedirs(value, exist_ok=True)
        os.environ[key] = value
    return dirs


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# implementations
# --------------------------------------------------------------------------------------------


class Impl:
    """One implementation: how to import it once and how to build ``fn(x, w) -> y``."""

    def __init__(self, name: str):
        self.name = name
        self.module: Any = None
        self.version: str | None = None
        self.import_error: str | None = None
        self.import_traceback: str | None = None
        self.api: str = ""

    def load(self) -> None:
        raise NotImplementedError

    def make_fn(self, eps: float) -> Callable:
        raise NotImplementedError

    def try_load(self) -> None:
        try:
            self.load()
        except BaseException as exc:  # noqa: BLE001 - record everything, keep going
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.import_error = short_error(exc)
            self.import_traceback = tb_tail()


class CakeImpl(Impl):
    def load(self) -> None:
        self.module = importlib.import_module("cake_rmsnorm_det_train")
        self.fn = self.module.rmsnorm_det
        self.version = getattr(self.module, "__version__", None) or dist_version(
            "cake-rmsnorm-det-train"
        )
        self.api = "cake_rmsnorm_det_train.rmsnorm_det(x, weight, eps=eps)"

    def make_fn(self, eps: float) -> Callable:
        rmsnorm_det = self.fn
        return lambda x, w: rmsnorm_det(x, w, eps=eps)


class TorchEagerImpl(Impl):
    def load(self) -> None:
        import torch
        import torch.nn.functional as F

        self.F = F
        self.version = torch.__version__
        self.api = "torch.nn.functional.rms_norm(x, (H,), weight, eps)"

    def make_fn(self, eps: float) -> Callable:
        F = self.F
        return lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps)


class TorchCompileImpl(Impl):
    def load(self) -> None:
        import torch
        import torch._functorch.config
        import torch.nn.functional as F

        self.torch = torch
        self.F = F
        self.version = torch.__version__
        # AOTAutograd donates saved buffers to the compiled backward by default, which forbids
        # retain_graph=True; the backward-only timing needs it, so turn donation off.
        torch._functorch.config.donated_buffer = False
        self.api = (
            "torch.compile(lambda x, w: F.rms_norm(x, (H,), w, eps), dynamic=False) "
            "with torch._functorch.config.donated_buffer=False"
        )

    def make_fn(self, eps: float) -> Callable:
        F = self.F

        def eager(x, w):
            return F.rms_norm(x, (x.shape[-1],), w, eps)

        # A fresh compiled function per shape (dynamo is reset between shapes), so the
        # first call of each shape includes the compilation of forward and backward.
        return self.torch.compile(eager, dynamic=False)


class LigerImpl(Impl):
    def load(self) -> None:
        # The submodule path always gives Liger's default Triton implementation.
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        self.cls = LigerRMSNormFunction
        self.version = dist_version("liger-kernel", "liger_kernel")
        self.api = (
            "liger_kernel.ops.rms_norm.LigerRMSNormFunction.apply(x, w, eps, offset=0.0, "
            "casting_mode='llama', in_place=False, row_mode=None)"
        )

    def make_fn(self, eps: float) -> Callable:
        apply = self.cls.apply
        # in_place=False: Liger's default (True) overwrites dy with dx in backward, which would
        # corrupt the shared dy across repeated timed backward calls and across implementations.
        return lambda x, w: apply(x, w, eps, 0.0, "llama", False, None)


class FlaImpl(Impl):
    def load(self) -> None:
        try:
            mod = importlib.import_module("fla.modules.norm.layernorm")  # fla-core >= 0.5
        except ModuleNotFoundError:
            mod = importlib.import_module("fla.modules.layernorm")  # older layouts
        self.rms_norm = mod.rms_norm
        fla = importlib.import_module("fla")
        self.version = getattr(fla, "__version__", None) or dist_version("fla-core")
        self.api = (
            f"{mod.__name__}.rms_norm(x, weight, bias=None, residual=None, eps=eps, "
            "prenorm=False, residual_in_fp32=False)"
        )

    def make_fn(self, eps: float) -> Callable:
        rms_norm = self.rms_norm
        return lambda x, w: rms_norm(x, w, None, residual=None, eps=eps)


IMPL_CLASSES = {
    "cake": CakeImpl,
    "torch_eager": TorchEagerImpl,
    "torch_compile": TorchCompileImpl,
    "liger": LigerImpl,
    "fla": FlaImpl,
}


# --------------------------------------------------------------------------------------------
# one shape
# --------------------------------------------------------------------------------------------


def reference(x, w, dy, eps: float):
    """fp32 reference y, dx, dw in closed form (no autograd graph kept)."""
    import torch

    xf, wf, gf = x.detach().float(), w.detach().float(), dy.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    y = xhat * wf
    dw = (gf * xhat).sum(0)
    g = gf * wf
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    del xf, gf, g, rstd, xhat
    return y, dx, dw


def bench_backward(fn, x, w, dy, timer: Timer) -> dict[str, float]:
    import torch

    y = fn(x, w)  # freed (with its graph) when this function returns
    return timer.bench(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))


def run_impl(impl: Impl, x, w, dy, ref, args, timer: Timer) -> dict[str, Any]:
    import torch

    rec: dict[str, Any] = {"status": "ok", "api": impl.api}
    grad = torch.autograd.grad
    fn = impl.make_fn(args.eps)

    # First call (compilation / autotuning included), fwd+bwd.
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    timer.sync()
    t0 = time.perf_counter()
    y = fn(x, w)
    dx, dw = grad(y, (x, w), dy)
    timer.sync()
    rec["first_call_s"] = time.perf_counter() - t0
    if args.device == "cuda":
        rec["first_call_extra_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20

    if not args.no_check:
        ry, rdx, rdw = ref
        rec["err_vs_fp32_ref"] = {
            "y": bench.err_stats(y, ry),
            "dx": bench.err_stats(dx, rdx),
            "dw": bench.err_stats(dw, rdw),
        }
        y2 = fn(x, w)
        dx2, dw2 = grad(y2, (x, w), dy)
        timer.sync()
        rec["bitwise_repeat"] = {
            "y": bool(torch.equal(y, y2)),
            "dx": bool(torch.equal(dx, dx2)),
            "dw": bool(torch.equal(dw, dw2)),
        }
        del y2, dx2, dw2
    del y, dx, dw

    # Forward (training forward: inputs require grad, so the autograd graph is built).
    rec["fwd"] = timer.bench(lambda: fn(x, w))

    # Backward on a pre-built graph.
    rec["bwd"] = bench_backward(fn, x, w, dy, timer)

    # Fresh forward + backward.
    def fwd_bwd():
        yy = fn(x, w)
        return grad(yy, (x, w), dy)

    rec["fwdbwd"] = timer.bench(fwd_bwd)
    if getattr(args, "graph", False) and args.device == "cuda":
        rec["fwdbwd_graph"] = bench_graphed(fwd_bwd, timer)
    return rec


def bench_graphed(fn: Callable[[], Any], timer: Timer) -> dict[str, Any]:
    """fwd+bwd captured once in a CUDA graph and replayed: the same kernels without the
    host time between launches. Returns {"ms": ...} or {"error": ...}."""
    try:
        g = bench.capture_cuda_graph(fn)
        out = timer.bench(g.replay)
        del g
        return out
    except Exception as exc:  # some anchors may not be capturable
        return {"error": short_error(exc)}


def run_shape(T: int, H: int, impls: dict[str, Impl], args, timer: Timer) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, DTYPES[args.dtype])
    elt = torch.empty((), dtype=dtype).element_size()
    n = T * H
    bytes_ = {ph: PHASE_BYTES[ph] * n * elt for ph in PHASES}
    res: dict[str, Any] = {"T": T, "H": H, "dtype": args.dtype, "bytes": bytes_, "impls": {}}

    if args.device == "cuda":
        torch._dynamo.reset()
    gen = torch.Generator(device=args.device).manual_seed(args.seed + T * 7919 + H)
    x = torch.randn(T, H, device=args.device, dtype=dtype, generator=gen).requires_grad_(True)
    w = (1.0 + 0.1 * torch.randn(H, device=args.device, generator=gen)).to(dtype)
    w.requires_grad_(True)
    dy = torch.randn(T, H, device=args.device, dtype=dtype, generator=gen)
    ref = None if args.no_check else reference(x, w, dy, args.eps)

    for name in args.impls:
        impl = impls[name]
        if impl.import_error is not None:
            res["impls"][name] = {"status": "import_error", "error": impl.import_error}
            continue
        if args.device != "cuda" and name in NEEDS_CUDA:
            res["impls"][name] = {"status": "skipped", "error": "needs CUDA"}
            continue
        if name == "torch_compile":
            torch._dynamo.reset()
        try:
            rec = run_impl(impl, x, w, dy, ref, args, timer)
        except BaseException as exc:  # noqa: BLE001 - one failing impl must not kill the run
            if isinstance(exc, KeyboardInterrupt):
                raise
            rec = bench.error_record(exc)
        x.grad = None
        w.grad = None
        free_memory(args.device)
        bench.add_bandwidth(rec, bytes_, args.peak_gbps, PHASES)
        res["impls"][name] = rec

    # Ratios cake_time / anchor_time (< 1: cake faster).
    res["ratio_cake_over_anchor"] = bench.cake_ratios(res["impls"], ANCHORS, PHASES)

    del x, w, dy, ref
    if args.device == "cuda":
        torch._dynamo.reset()
    free_memory(args.device)
    return res


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------


def markdown_shape(res: dict[str, Any]) -> str:
    T, H = res["T"], res["H"]
    head = [f"### T={T} H={H} {res['dtype']}", ""]
    cols = ["impl"]
    for ph in PHASES:
        lab = PHASE_LABEL[ph]
        cols += [f"{lab} ms", f"{lab} GB/s", f"{lab} %peak"]
    cols += ["first call s"] + [f"cake/x {PHASE_LABEL[ph]}" for ph in PHASES]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1))]
    lines[-1] += "|"
    ratios = res.get("ratio_cake_over_anchor", {})
    notes = []
    for name, rec in res["impls"].items():
        if rec.get("status") != "ok":
            notes.append(f"- {name}: {rec.get('status')}: {rec.get('error', '')[:300]}")
            lines.append("| " + " | ".join([name] + ["—"] * (len(cols) - 1)) + " |")
            continue
        row = [name]
        for ph in PHASES:
            p = rec[ph]
            row += [fmt(p["ms"], ".4f"), fmt(p["gbps"], ".0f"), fmt(p["pct_peak"], ".1f")]
        row.append(fmt(rec.get("first_call_s"), ".2f"))
        r = ratios.get(name)
        row += [fmt(r.get(ph) if r else None, ".3f") for ph in PHASES]
        lines.append("| " + " | ".join(row) + " |")

    # Accuracy / determinism table.
    acc = [
        "",
        "| impl | y max abs err | dx max abs err | dw max abs err | dw rel err "
        "| bitwise repeat y/dx/dw |",
        "|---|---:|---:|---:|---:|---|",
    ]
    any_acc = False
    for name, rec in res["impls"].items():
        e = rec.get("err_vs_fp32_ref")
        if not e:
            continue
        any_acc = True
        rep = rec.get("bitwise_repeat", {})
        rep_s = "/".join("yes" if rep.get(k) else "no" for k in ("y", "dx", "dw"))
        acc.append(
            f"| {name} | {e['y']['max_abs']:.3g} | {e['dx']['max_abs']:.3g} "
            f"| {e['dw']['max_abs']:.3g} | {e['dw']['max_rel_to_max']:.3g} | {rep_s} |"
        )
    out = head + lines
    graphed = {n: r["fwdbwd_graph"] for n, r in res["impls"].items()
               if r.get("status") == "ok" and "fwdbwd_graph" in r}
    if graphed:
        cake_g = graphed.get("cake", {}).get("ms")
        out += ["", "| impl | f+b eager ms | f+b CUDA graph ms | cake/x graph |",
                "|---|---:|---:|---:|"]
        for name, g in graphed.items():
            ms = g.get("ms")
            ratio = cake_g / ms if cake_g and ms else None
            eager = res["impls"][name]["fwdbwd"]["ms"]
            out.append(f"| {name} | {fmt(eager, '.4f')} | "
                       f"{fmt(ms, '.4f') if ms else g.get('error', '—')[:80]} | "
                       f"{fmt(ratio, '.3f')} |")
    if any_acc:
        out += acc
    if notes:
        out += [""] + notes
    return "\n".join(out)


def markdown_header(meta: dict[str, Any]) -> str:
    keys = [
        ("date", "date"),
        ("device", "device"),
        ("torch", "torch"),
        ("cuda", "torch.version.cuda"),
        ("triton", "triton"),
        ("cake", "cake_rmsnorm_det_train"),
        ("liger", "liger-kernel"),
        ("fla", "fla-core"),
        ("timer", "timer"),
        ("peak_gbps", "peak GB/s for %peak"),
        ("git_commit", "git commit"),
    ]
    lines = ["## cake rmsnorm_det benchmark", ""]
    for k, label in keys:
        lines.append(f"- {label}: {meta.get(k)}")
    for name, err in meta.get("import_errors", {}).items():
        lines.append(f"- import error {name}: {err[:300]}")
    lines += [
        "- bytes: fwd 2·T·H·elt, bwd 3·T·H·elt, f+b 5·T·H·elt; cake/x < 1 means cake is faster",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cache_dirs = setup_fresh_caches(args.keep_caches)

    import torch

    triton = bench.import_triton()  # after cake chose CUDA or the interpreter
    if bench.cuda_missing(args.device):
        return 2

    impls: dict[str, Impl] = {}
    for name in args.impls:
        impl = IMPL_CLASSES[name](name)
        impl.try_load()
        impls[name] = impl

    device_desc = bench.device_description(args.device)
    timer = Timer(args.device, args.quick, args.warmup, args.rep)

    def ver(name: str) -> str | None:
        impl = impls.get(name)
        if impl is None:
            return None
        return impl.version if impl.import_error is None else "import failed"

    meta = {
        "date": bench.utc_now(),
        "device": device_desc,
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "cake": ver("cake"),
        "liger": ver("liger"),
        "fla": ver("fla"),
        "timer": timer.kind,
        "warmup": timer.warmup,
        "rep": timer.rep,
        "peak_gbps": args.peak_gbps,
        "eps": args.eps,
        "dtype": args.dtype,
        "git_commit": git_commit(),
        "fresh_caches": cache_dirs or None,
        "fwd_mode": "training forward (x and w require grad)",
        "import_errors": {n: i.import_error for n, i in impls.items() if i.import_error},
        "import_tracebacks": {n: i.import_traceback for n, i in impls.items() if i.import_error},
        "apis": {n: i.api for n, i in impls.items() if not i.import_error},
        "argv": sys.argv if argv is None else argv,
    }
    print(markdown_header(meta), flush=True)

    payload: dict[str, Any] = {"meta": meta, "results": []}
    for T, H in args.shapes:
        try:
            res = run_shape(T, H, impls, args, timer)
        except BaseException as exc:  # noqa: BLE001 - e.g. OOM allocating the inputs
            if isinstance(exc, KeyboardInterrupt):
                raise
            res = {"T": T, "H": H, "status": "error", "error": short_error(exc)}
            res["traceback"] = tb_tail()
            free_memory(args.device)
            print(f"### T={T} H={H}: shape failed: {res['error']}\n", flush=True)
        else:
            print(markdown_shape(res) + "\n", flush=True)
        payload["results"].append(res)
        write_json(args.out, payload)  # after every shape, so a timeout keeps what was done

    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
