"""Helpers the benchmarks share: argument parsing, run records, timers, result helpers.

Used by ``packages/*/benchmarks/bench_*.py`` and the ``shared/gpu`` scripts (which run from
source, ``PYTHONPATH`` over ``packages/*/src``), never by kernels or entry points. Plain
Python and torch: Triton is imported only by the functions that time with
``triton.testing.do_bench``, after :mod:`cake_core.triton_utils` chose CUDA or the
interpreter. CUDA-only helpers (events, graphs, the profiler) say so.

Timing conventions: every timer returns milliseconds. ``summarize_ms`` reports the median
with p20/p80 taken by index in the sorted times (``times[int(0.2 * (n - 1))]``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "Timer",
    "add_bandwidth",
    "bits_sha256",
    "cake_ratios",
    "capture_cuda_graph",
    "compare_cases",
    "cuda_missing",
    "cuda_ms",
    "cuda_profile",
    "cuda_profile_table",
    "device_description",
    "dist_version",
    "do_bench_ms",
    "err_stats",
    "error_record",
    "fmt",
    "free_memory",
    "import_triton",
    "load_impls",
    "max_rel_error",
    "parse_names",
    "parse_overrides",
    "parse_shapes",
    "short_error",
    "summarize_ms",
    "time_calls",
    "time_fwd_bwd",
    "traceback_tail",
    "utc_now",
    "write_json",
]

# ----------------------------------------------------------------------------- arguments


def parse_shapes(text: str, ndim: int, expected: str, *,
                 strict: bool = False) -> list[tuple[int, ...]]:
    """Comma-separated shapes such as ``"1024x512,2048x256"``, each of ``ndim`` sizes (an
    ``argparse`` ``type=`` helper; wrap it in a function of the benchmark's own).

    Default rules: items are stripped and lower-cased, empty items skipped; an item
    without ``ndim`` parts raises ``"bad shape {item!r}; expected {expected}"``, a part
    that is not an int raises ``ValueError`` (argparse: "invalid ... value"), a size
    ``<= 0`` ``"bad shape ...; sizes must be positive"``, no shape at all ``"no shapes
    given"``. With ``strict`` every item (none skipped) must be ``ndim`` decimal digit
    strings, each ``> 0``, else ``"bad shape {item!r}; expected {expected}"`` with the item
    as given.

    Raises:
        argparse.ArgumentTypeError: as above.
    """
    shapes = []
    for item in text.split(","):
        if strict:
            parts = item.strip().lower().split("x")
            if len(parts) != ndim or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise argparse.ArgumentTypeError(f"bad shape {item!r}; expected {expected}")
            shapes.append(tuple(int(p) for p in parts))
            continue
        item = item.strip().lower()
        if not item:
            continue
        parts = item.split("x")
        if len(parts) != ndim:
            raise argparse.ArgumentTypeError(f"bad shape {item!r}; expected {expected}")
        sizes = tuple(int(p) for p in parts)
        if any(s <= 0 for s in sizes):
            raise argparse.ArgumentTypeError(f"bad shape {item!r}; sizes must be positive")
        shapes.append(sizes)
    if not shapes and not strict:
        raise argparse.ArgumentTypeError("no shapes given")
    return shapes


def parse_names(text: str, known: Sequence[str], *, what: str = "",
                allow_empty: bool = True) -> list[str]:
    """Comma-separated names, each one of ``known`` (an ``argparse`` ``type=`` helper).

    Raises:
        argparse.ArgumentTypeError: ``"unknown {what} [...]; known: [...]"`` for unknown
            names, or for an empty list unless ``allow_empty``.
    """
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if s not in known]
    if unknown or not (items or allow_empty):
        label = f"{what} " if what else ""
        raise argparse.ArgumentTypeError(f"unknown {label}{unknown}; known: {list(known)}")
    return items


def parse_ints(text: str) -> list[int]:
    """Comma-separated positive ints, e.g. ``"8,64,128"`` (an ``argparse`` ``type=`` helper).

    Raises:
        argparse.ArgumentTypeError: a non-integer item, an empty list or a value < 1.
    """
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") \
            from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return vals


def parse_overrides(items: Iterable[str]) -> dict[str, int]:
    """``["block_v=32", ...]`` -> ``{"block_v": 32, ...}`` (plan field overrides)."""
    return {kv.split("=")[0]: int(kv.split("=")[1]) for kv in items}


def cuda_missing(device: str,
                 message: str = "CUDA is not available; use --device cpu for a smoke test"
                 ) -> bool:
    """True (after printing ``message`` to stderr) when ``device`` is ``"cuda"`` and torch
    sees no CUDA device; the benchmark then exits with status 2."""
    if device == "cuda" and not torch.cuda.is_available():
        print(message, file=sys.stderr)
        return True
    return False


def import_triton():
    """The ``triton`` module, imported after :mod:`cake_core.triton_utils` chose CUDA or
    the interpreter (importing Triton first would leave its helpers in compiled mode)."""
    from cake_core import triton_utils  # picks the backend, then imports Triton

    return triton_utils.triton


# ----------------------------------------------------------------------------- run records


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def device_description(device: str) -> str:
    """``"<GPU name> (<memory> GiB, <SMs> SMs)"`` for CUDA device 0, else
    ``"cpu (<processor>)"``."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return (f"{props.name} ({props.total_memory / 2**30:.0f} GiB, "
                f"{props.multi_processor_count} SMs)")
    return f"cpu ({platform.processor() or platform.machine()})"


def dist_version(*names: str) -> str | None:
    """The installed version of the first distribution of ``names`` found, else None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except Exception:
            continue
    return None


def short_error(exc: BaseException, limit: int = 2000) -> str:
    """``"<Type>: <message>"``, stripped, at most ``limit`` characters."""
    return f"{type(exc).__name__}: {exc}".strip()[:limit]


def traceback_tail(limit: int = 1500) -> str:
    """The last ``limit`` characters of the traceback being handled."""
    return traceback.format_exc()[-limit:]


def error_record(exc: BaseException) -> dict[str, Any]:
    """``{"status": "error", "error": short_error(exc), "traceback": traceback_tail()}``:
    what a benchmark records for a run that raised (inside the ``except``)."""
    return {"status": "error", "error": short_error(exc), "traceback": traceback_tail()}


def write_json(path: str | None, payload: dict[str, Any], *, indent: int = 2) -> None:
    """Write ``payload`` to ``path`` (nothing when ``path`` is empty) through a temporary
    file and a rename, so a run killed mid-write leaves the previous file; objects JSON
    cannot encode are written as ``str``."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=indent, default=str)
    os.replace(tmp, path)


def free_memory(device: str) -> None:
    """Collect garbage and, on CUDA, synchronize and return cached blocks."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def load_impls(names: Iterable[str], make: Callable[[str], Any]) -> dict[str, Any]:
    """``{name: make(name)}`` for each name; a ``make`` that raises (e.g. an anchor not
    installed) prints ``"<name>: unavailable (...)"`` and leaves the name out."""
    impls = {}
    for name in names:
        try:
            impls[name] = make(name)
        except Exception as e:  # noqa: BLE001 - e.g. FLA not installed
            print(f"{name}: unavailable ({type(e).__name__}: {e})")
    return impls


# ----------------------------------------------------------------------------- timing


def summarize_ms(times: Sequence[float]) -> dict[str, float]:
    """``{"ms": median, "p20_ms", "p80_ms"}`` of ``times`` (ms; at least one)."""
    times = sorted(times)
    n = len(times)
    return {"ms": statistics.median(times), "p20_ms": times[int(0.2 * (n - 1))],
            "p80_ms": times[int(0.8 * (n - 1))]}


def time_calls(fn: Callable[[], Any], warmup: int, reps: int, device: str, *,
               sync_each: bool = False) -> list[float]:
    """Milliseconds of each of ``reps`` calls of ``fn`` after ``warmup`` untimed calls.

    On ``"cuda"``: a pair of CUDA events around every call (device time of the call's
    launches, host gaps included); with ``sync_each`` the host waits for each call's end
    before the next call, else it records every pair and waits once. Elsewhere:
    ``time.perf_counter`` around each call.
    """
    for _ in range(warmup):
        fn()
    if device != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
        if sync_each:
            end.synchronize()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def do_bench_ms(fn: Callable[[], Any], warmup: float, rep: float) -> dict[str, float]:
    """``triton.testing.do_bench`` (``warmup`` / ``rep`` in ms, L2 flushed before each
    repetition): ``{"ms": median, "p20_ms", "p80_ms"}``. CUDA."""
    import_triton()
    from triton.testing import do_bench

    med, p20, p80 = (float(v) for v in do_bench(fn, warmup=warmup, rep=rep,
                                                quantiles=[0.5, 0.2, 0.8]))
    return {"ms": med, "p20_ms": p20, "p80_ms": p80}


class Timer:
    """One timing method per run: ``do_bench`` budgets (ms) on CUDA, a ``perf_counter``
    loop (iterations) on the CPU.

    Args:
        device: ``"cuda"`` or ``"cpu"``.
        quick: smaller defaults (smoke tests).
        warmup, rep: ``None`` for the defaults: on CUDA 25 / 100 ms (quick 5 / 20); on
            the CPU ``cpu_full`` (quick ``cpu_quick``) iterations ``(warmup, rep)``.
    """

    def __init__(self, device: str, quick: bool, warmup: float | None, rep: float | None, *,
                 cpu_quick: tuple[int, int] = (1, 3), cpu_full: tuple[int, int] = (3, 10)):
        self.device = device
        if device == "cuda":
            self.warmup = warmup if warmup is not None else (5.0 if quick else 25.0)
            self.rep = rep if rep is not None else (20.0 if quick else 100.0)
            self.kind = "triton.testing.do_bench (ms budgets, L2 flushed, quantiles 0.5/0.2/0.8)"
        else:  # iteration counts on the CPU
            w, r = cpu_quick if quick else cpu_full
            self.warmup = int(warmup) if warmup is not None else w
            self.rep = int(rep) if rep is not None else r
            self.kind = "time.perf_counter loop (iterations)"

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def bench(self, fn: Callable[[], Any]) -> dict[str, float]:
        """``{"ms": median, "p20_ms", "p80_ms"}`` of ``fn``."""
        if self.device == "cuda":
            return do_bench_ms(fn, self.warmup, self.rep)
        return summarize_ms(time_calls(fn, max(self.warmup, 0), max(self.rep, 1), "cpu"))

    def alternating(self, fns: dict[str, Callable[[], Any]], rounds: int = 3
                    ) -> dict[str, dict[str, float]]:
        """``{name: {"ms": the median over rounds of bench's median, "rounds_ms": [...]}}``:
        every function of ``fns`` timed once per round, in turn, ``rounds`` rounds, so that
        a drift of the machine (clocks, caches, a first-run cost) falls on all alike."""
        got: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(max(1, rounds)):
            for name, fn in fns.items():
                got[name].append(self.bench(fn)["ms"])
        return {name: {"ms": statistics.median(v), "rounds_ms": v} for name, v in got.items()}


def cuda_ms(fn: Callable[[], Any], reps: int, warmup: int = 2) -> float:
    """The upper median (``sorted(times)[reps // 2]``) of ``reps`` CUDA-event times of
    ``fn``, each call waited for, after ``warmup`` calls. CUDA."""
    times = time_calls(fn, warmup, reps, "cuda", sync_each=True)
    return sorted(times)[len(times) // 2]


def time_fwd_bwd(forward: Callable[[], Sequence[torch.Tensor]],
                 grad_outputs: Sequence[torch.Tensor], reps: int, *,
                 first_call: Callable[[], Any]) -> dict[str, float]:
    """A training step's times (CUDA): ``first_s``, the wall time of ``first_call()``
    (compilation and autotuning included); ``fwd_ms``, ``forward()`` (an autograd forward
    returning the outputs); ``bwd_ms``, ``torch.autograd.backward(outputs, grad_outputs,
    retain_graph=True)`` on one pre-built graph; ``fwd_bwd_ms``, a fresh forward and its
    backward. Each the :func:`cuda_ms` of ``reps`` runs."""
    t0 = time.perf_counter()
    first_call()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    fwd = cuda_ms(forward, reps)
    outs = forward()
    bwd = cuda_ms(lambda: torch.autograd.backward(outs, grad_outputs, retain_graph=True), reps)
    both = cuda_ms(lambda: torch.autograd.backward(forward(), grad_outputs), reps)
    return dict(first_s=first_s, fwd_ms=fwd, bwd_ms=bwd, fwd_bwd_ms=both)


def capture_cuda_graph(fn: Callable[[], Any], warmup: int = 3, *,
                       with_outputs: bool = False):
    """``fn`` run ``warmup`` times on a side stream, then captured once in a CUDA graph on
    that same stream (caches kept per stream, such as cake's chunk tables, hit). Returns the
    graph (replay it with ``.replay()``: the same kernels without the host time between
    launches), or ``(graph, what the captured call returned)`` with ``with_outputs``. CUDA."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return (g, out) if with_outputs else g


def cuda_profile(step: Callable[[], Any], warmup: int = 2, iters: int = 3):
    """A finished ``torch.profiler.profile`` (CUDA activity) of ``iters`` calls of ``step``,
    after ``warmup`` calls; read it with ``.key_averages()``. CUDA."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    return p


def cuda_profile_table(step: Callable[[], Any], warmup: int = 2, iters: int = 3,
                       row_limit: int = 25) -> str:
    """The :func:`cuda_profile` table of the CUDA kernels, sorted by total CUDA time."""
    return cuda_profile(step, warmup, iters).key_averages().table(
        sort_by="cuda_time_total", row_limit=row_limit, max_name_column_width=60)


# ----------------------------------------------------------------------------- results


def err_stats(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``{"max_abs": max |out - ref|, "max_rel_to_max": max_abs / max |ref|}`` in fp32
    (``max_abs`` itself when ``ref`` is all zeros)."""
    diff = (out.detach().float() - ref.float()).abs()
    max_abs = float(diff.max())
    scale = float(ref.float().abs().max())
    return {"max_abs": max_abs, "max_rel_to_max": max_abs / scale if scale > 0 else max_abs}


def max_rel_error(a: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.float64
                  ) -> float:
    """``max |a - ref| / max |ref|`` (the denominator at least 1e-30), computed in
    ``dtype``."""
    r = ref.detach().to(dtype)
    return float((a.detach().to(dtype) - r).abs().max() / r.abs().max().clamp_min(1e-30))


def bits_sha256(tensors: Iterable[torch.Tensor | None]) -> str:
    """sha256 (hex) over the raw bytes of the tensors, in order (``None`` skipped): equal
    digests mean equal bits (compare across runs and processes)."""
    h = hashlib.sha256()
    for t in tensors:
        if t is not None:
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def repeat_hashes(outputs_of: Callable[[], Sequence[torch.Tensor | None]],
                  names: Sequence[str], runs: int = 5) -> list[str]:
    """``runs`` calls of ``outputs_of()``: the first 16 hex digits of :func:`bits_sha256` of
    each call's outputs (all equal = bitwise repeatable). When they differ, also prints the
    outputs (by ``names``, in ``outputs_of()``'s order) that took more than one value, with
    how many, so a repeat failure says where it is."""
    combined, per = [], []
    for _ in range(runs):
        outs = list(outputs_of())
        if len(outs) != len(names):
            raise ValueError(f"{len(outs)} outputs for {len(names)} names")
        combined.append(bits_sha256(outs)[:16])
        per.append([bits_sha256([t])[:16] if t is not None else "-" for t in outs])
    if len(set(combined)) > 1:
        differ = {n: len({p[i] for p in per}) for i, n in enumerate(names)
                  if len({p[i] for p in per}) > 1}
        print(f"outputs that differ between the {runs} runs (distinct values): {differ}",
              flush=True)
    return combined


def add_bandwidth(rec: dict[str, Any], nbytes: dict[str, int], peak_gbps: float,
                  phases: Iterable[str]) -> None:
    """For each phase timed in ``rec`` (``rec[phase]["ms"]``), add ``gbps`` (``nbytes[phase]``
    over the time) and ``pct_peak`` (of ``peak_gbps``)."""
    for ph in phases:
        if ph in rec:
            ms = rec[ph]["ms"]
            gbps = nbytes[ph] / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")
            rec[ph]["gbps"] = gbps
            rec[ph]["pct_peak"] = 100.0 * gbps / peak_gbps


def cake_ratios(impls: dict[str, dict[str, Any]], anchors: Iterable[str],
                phases: Iterable[str]) -> dict[str, dict[str, float | None]]:
    """``{anchor: {phase: cake_ms / anchor_ms}}`` (below 1: cake faster; ``None`` where
    either was not timed) for each anchor present in ``impls``."""
    phases = tuple(phases)
    cake = impls.get("cake", {})
    ratios: dict[str, dict[str, float | None]] = {}
    for name in anchors:
        anchor = impls.get(name)
        if anchor is None:
            continue
        ratios[name] = {}
        for ph in phases:
            c = cake.get(ph, {}).get("ms")
            a = anchor.get(ph, {}).get("ms")
            ratios[name][ph] = c / a if (c is not None and a) else None
    return ratios


def fmt(v: float | None, spec: str) -> str:
    """``format(v, spec)``, or ``"—"`` for None and NaN."""
    return "—" if v is None or v != v else format(v, spec)


def compare_cases(case_names: Iterable[str], make_case: Callable[[str], Any],
                  impls: dict[str, Any], *,
                  time_impl: Callable[[Any, Any], dict[str, float]] | None = None,
                  hashes: Callable[[Any, Any], Any] | None = None,
                  profile: Callable[[Any, Any], Any] | None = None, profile_case: str = "",
                  baseline: str = "cake", anchor: str = "fla") -> dict[str, dict[str, Any]]:
    """Run every implementation on every case and print as it goes.

    Per case (``make_case(name)``) and implementation: ``hashes(fn, case)`` (recorded as
    ``"<impl>_hash"``), ``time_impl(fn, case)`` (a dict of times in ms), and
    ``profile(fn, case)`` on the case named ``profile_case``; a failure is recorded as
    ``"failed: ..."`` and the next one runs. When both ``baseline`` and ``anchor`` were
    timed, ``"ratio"`` holds baseline / anchor for ``fwd_ms``, ``bwd_ms``, ``fwd_bwd_ms``.
    Returns ``{case: row}``.
    """
    out = {}
    for cname in case_names:
        c = make_case(cname)
        row: dict[str, Any] = {}
        for name, fn in impls.items():
            try:
                if hashes is not None:
                    row[name + "_hash"] = hashes(fn, c)
                    print(cname, name, "hashes", row[name + "_hash"], flush=True)
                if time_impl is not None:
                    row[name] = time_impl(fn, c)
                    print(cname, name, {k: round(v, 3) for k, v in row[name].items()},
                          flush=True)
                if profile is not None and profile_case == cname:
                    profile(fn, c)
            except Exception as e:  # noqa: BLE001 - recorded, the next one runs
                row[name] = f"failed: {type(e).__name__}: {e}"[:300]
                print(cname, name, row[name], flush=True)
        if isinstance(row.get(baseline), dict) and isinstance(row.get(anchor), dict):
            row["ratio"] = {k: row[baseline][k] / row[anchor][k]
                            for k in ("fwd_ms", "bwd_ms", "fwd_bwd_ms")}
            print(cname, f"{baseline}/{anchor}",
                  {k: round(v, 3) for k, v in row["ratio"].items()}, flush=True)
        out[cname] = row
        del c
        torch.cuda.empty_cache()
    return out


#: SASS instruction groups :func:`offline_sm90_build` counts.
SASS_GROUPS = {
    "HGMMA": r"\bHGMMA", "HMMA": r"\bHMMA", "UTMALDG": r"\bUTMALDG", "LDGSTS": r"\bLDGSTS",
    "LDG": r"\bLDG(\.|\s)", "STG": r"\bSTG(\.|\s)", "LDS": r"\bLDS(\.|\s)",
    "STS": r"\bSTS(\.|\s)", "LDSM": r"\bLDSM", "BAR": r"\bBAR(\.|\s)",
    "LDL/STL": r"\b(LDL|STL)(\.|\s)",
}


def offline_sm90_build(fn, types: dict, consts: dict, div16: tuple, num_warps: int,
                       num_stages: int):
    """Compile the ``@triton.jit`` function ``fn`` for sm_90 without a GPU (Triton's own
    compiler and its bundled cuobjdump; ``TRITON_INTERPRET`` must be unset, so cake picks
    the compiled backend) and return ``(regs, stack bytes, shared bytes, ptx facts, SASS
    counts)``. ``types``: Triton signature types by argument name; ``consts``: constexpr
    values; ``div16``: arguments Triton would mark 16-divisible at launch (pointers from
    torch's allocator, strides that are multiples of 16). Static facts, not timings."""
    import collections
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in consts else types[n] for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
        path = f.name
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
    res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    os.unlink(path)
    ptx = k.asm["ptx"]
    use = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res))
    counts = collections.OrderedDict(
        (g, len(re.findall(p, sass))) for g, p in SASS_GROUPS.items())
    counts["SASS"] = sum(1 for line in sass.splitlines()
                         if re.match(r"\s+/\*[0-9a-f]{4}", line))
    ptx_facts = {"wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
                 "cp.async.bulk.tensor": len(re.findall(r"\bcp\.async\.bulk\.tensor", ptx)),
                 "cp.async(non-bulk)": len(re.findall(r"\bcp\.async\.(ca|cg)", ptx))}
    return use.get("REG"), use.get("STACK"), k.metadata.shared, ptx_facts, counts
