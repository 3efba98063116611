"""Benchmark cake's deterministic MoE grouped GEMM against torch._grouped_mm.

Phases, for tokens sorted by expert, x ``[M, K]`` (M = tokens · top_k routed rows),
weight ``[E, N, K]``, expert e's rows given by ``offs`` (2·M·N·K flops each):

- ``fwd``:   y[rows of e]  = x[rows of e] · W[e]ᵀ   (torch: ``_grouped_mm(x, w.mT, offs)``)
- ``dgrad``: dx[rows of e] = dy[rows of e] · W[e]   (torch: ``_grouped_mm(dy, w, offs)``)
- ``wgrad``: dW[e] = dy[rows of e]ᵀ · x[rows of e]  (torch: ``_grouped_mm(dy.t(), x, offs)``;
  cake: the plan's per-expert split-K with the ordered sum)

Routings: ``balanced`` (every expert M / E rows) and ``skewed`` (a quarter of the experts
empty, the rest with Zipf-like sizes 1/(rank+1)^1.2, largest first then shuffled by a fixed
seed). Each case builds the sizes on the host, then hands only the device offsets to both
sides. A phase that torch._grouped_mm cannot run (missing in this torch, dtype, alignment,
device) is recorded as an error; ``--loop-anchor`` adds a per-expert ``torch.mm`` loop
(host-synced offsets) as a second anchor.

cake phases call the family's launch functions directly (no autograd, no input checks), with
the plan ``make_plan`` picks (recorded in the JSON) and a workspace built once. Ratios are
cake_time / torch_time: below 1 means cake is faster. ``--check`` (default on) compares with
a float64 per-expert reference (relative Frobenius error) and repeats wgrad bitwise.

GPU run (one H200; the issue's grid: E in 8, 64, 128; top-8 of 16384 tokens; (N, K) in
(3072, 4096), (4096, 1536); bf16)::

    cd packages/cake-moe-grouped-det-gemm/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 \\
        bench_cake_moe_grouped_det_gemm.py --out $OUT/moe_bench.json

The TMA kernels (plan field ``tma``, the rule's choice on Hopper since session 11; ``--plan
tma=0`` for the pointer kernels; any plan
field can be replaced, ``--plan KEY=INT ...``; the JSON records the plan run). With
``grouped_mm_fwd_dgrad = 1`` (the rule's choice on Hopper for bf16 with N and K multiples
of 8; ``--plan grouped_mm_fwd_dgrad=0`` turns it off) cake's fwd and dgrad are
``torch._grouped_mm`` plus the zeroing of the rows past the last expert.

CPU smoke test (Triton interpreter, perf_counter timer, tiny shapes)::

    python3 .../bench_cake_moe_grouped_det_gemm.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cake_core import bench
from cake_core.bench import Timer

DEFAULT_EXPERTS = (8, 64, 128)
DEFAULT_NK = ((3072, 4096), (4096, 1536))
DEFAULT_TOKENS, DEFAULT_TOP_K = 16384, 8
QUICK_CPU = {"experts": (2, 4), "nk": ((24, 40),), "tokens": 32, "top_k": 2}
ROUTINGS = ("balanced", "skewed")
PHASES = ("fwd", "dgrad", "wgrad")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_nk(text: str) -> list[tuple[int, int]]:
    return bench.parse_shapes(text, 2, "NxK, e.g. 3072x4096", strict=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--experts", type=bench.parse_ints, default=None, help="E values (8,64,128)")
    p.add_argument("--nk", type=parse_nk, default=None, help="NxK pairs (3072x4096,4096x1536)")
    p.add_argument("--tokens", type=int, default=None, help="tokens before routing (16384)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (8)")
    p.add_argument("--routings", default=",".join(ROUTINGS),
                   help="comma-separated subset of " + ", ".join(ROUTINGS))
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--no-check", action="store_true", help="skip accuracy/repeat checks")
    p.add_argument("--loop-anchor", action="store_true",
                   help="also time a per-expert torch.mm loop (host-synced offsets)")
    p.add_argument("--plan", nargs="*", default=[], metavar="KEY=INT",
                   help="replace fields of the plan make_plan picks (e.g. block_n=256 "
                   "num_stages=4 wgrad_splits=2): a sweep aid; the JSON records the plan run")
    return p


def group_sizes(M: int, E: int, routing: str, seed: int = 0) -> list[int]:
    """Rows per expert summing to M: ``balanced`` (as even as integers allow) or ``skewed``
    (E // 4 experts empty, the rest Zipf-like, then shuffled by ``seed``)."""
    import random

    if routing == "balanced":
        return [M // E + (1 if e < M % E else 0) for e in range(E)]
    if routing != "skewed":
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    live = max(1, E - E // 4)
    weights = [1.0 / (r + 1) ** 1.2 for r in range(live)]
    total = sum(weights)
    sizes = [int(M * w / total) for w in weights]
    sizes[0] += M - sum(sizes)
    sizes += [0] * (E - live)
    random.Random(seed).shuffle(sizes)
    return sizes


def _grouped_mm():
    import torch

    return getattr(torch, "_grouped_mm", None)


def run_case(E: int, N: int, K: int, routing: str, tokens: int, top_k: int, dtype,
             device: str, timer: Timer, check: bool, loop_anchor: bool,
             plan_over: dict[str, int] | None = None) -> dict[str, Any]:
    import torch
    from cake_core.testing import bitwise_equal
    from cake_core.testing import rel_fro_error as rel_err
    from cake_moe_grouped_det_gemm import MoEGroupedDetWorkspace, make_plan
    from cake_moe_grouped_det_gemm.api import _launch_bwd, _launch_fwd, _row_ends
    from cake_moe_grouped_det_gemm.plan import grouped_mm_problem, tma_problem

    M = tokens * top_k
    sizes = group_sizes(M, E, routing)
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
    w = torch.randn(E, N, K, device=device, dtype=dtype, generator=g) * K ** -0.5
    dy = torch.randn(M, N, device=device, dtype=dtype, generator=g)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    ends = _row_ends(offs, None, M)
    plan = make_plan(M, E, N, K, dtype, device)
    if plan_over:
        import dataclasses

        plan = dataclasses.replace(plan, **plan_over)
    # the launches below skip the API's checks
    for why in (tma_problem(plan, dtype), grouped_mm_problem(plan, dtype, torch.device(device))):
        if why is not None:
            raise ValueError(f"--plan: {why}")
    ws = MoEGroupedDetWorkspace.for_plan(plan, device)
    parts = ws["partials"] if plan.wgrad_splits > 1 else None

    cake = {
        "fwd": lambda: _launch_fwd(x, w, ends, plan),
        "dgrad": lambda: _launch_bwd(dy, x, w, ends, plan, parts, None, True, False)[0],
        "wgrad": lambda: _launch_bwd(dy, x, w, ends, plan, parts, None, False, True)[1],
    }
    anchors: dict[str, dict[str, Any]] = {}
    gmm = _grouped_mm()
    if gmm is not None:
        anchors["torch._grouped_mm"] = {
            "fwd": lambda: gmm(x, w.transpose(-2, -1), offs=offs),
            "dgrad": lambda: gmm(dy, w, offs=offs),
            "wgrad": lambda: gmm(dy.t(), x, offs=offs),
        }
    if loop_anchor or gmm is None:
        bounds = [0, *torch.tensor(sizes).cumsum(0).tolist()]

        def loop(phase):
            def run():
                outs = []
                for e in range(E):
                    a, b = bounds[e], bounds[e + 1]
                    if phase == "fwd":
                        outs.append(x[a:b] @ w[e].t())
                    elif phase == "dgrad":
                        outs.append(dy[a:b] @ w[e])
                    else:
                        outs.append(dy[a:b].t() @ x[a:b])
                return outs
            return run

        anchors["torch.mm loop"] = {ph: loop(ph) for ph in PHASES}

    flops = 2.0 * M * N * K
    res: dict[str, Any] = {"E": E, "N": N, "K": K, "routing": routing, "M": M,
                           "empty_experts": sum(1 for s in sizes if s == 0),
                           "max_rows": max(sizes), "plan": plan.to_dict(), "phases": {}}
    if check:
        bnd = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        x64, w64, dy64 = x.double(), w.double(), dy.double()
        y_ref = torch.cat([x64[bnd[e]:bnd[e + 1]] @ w64[e].t() for e in range(E)])
        dx_ref = torch.cat([dy64[bnd[e]:bnd[e + 1]] @ w64[e] for e in range(E)])
        dw_ref = torch.stack([dy64[bnd[e]:bnd[e + 1]].t() @ x64[bnd[e]:bnd[e + 1]]
                              for e in range(E)])
        res["rel_err"] = {"fwd": rel_err(cake["fwd"](), y_ref),
                          "dgrad": rel_err(cake["dgrad"](), dx_ref),
                          "wgrad": rel_err(cake["wgrad"](), dw_ref)}
        del x64, w64, dy64, y_ref, dx_ref, dw_ref
        res["wgrad_bitwise_repeat"] = bitwise_equal(cake["wgrad"](), cake["wgrad"]())
    for ph in PHASES:
        row: dict[str, Any] = {}
        for name, fns in (("cake", cake), *anchors.items()):
            try:
                t = timer.bench(fns[ph])
                t["tflops"] = flops / (t["ms"] * 1e-3) / 1e12
                row[name] = t
            except Exception as exc:  # noqa: BLE001 - recorded, not fatal
                row[name] = {"error": bench.short_error(exc, 300)}
        row["ratios"] = {name: row["cake"]["ms"] / row[name]["ms"] for name in anchors
                         if "ms" in row["cake"] and "ms" in row[name]}
        res["phases"][ph] = row
    return res


def markdown_case(res: dict[str, Any]) -> str:
    anchors = [n for n in next(iter(res["phases"].values())) if n not in ("cake", "ratios")]
    head = (f"### E={res['E']} N={res['N']} K={res['K']} {res['routing']} (M={res['M']}, "
            f"{res['empty_experts']} empty, largest {res['max_rows']} rows, wgrad_splits="
            f"{res['plan']['wgrad_splits']})")
    cols = ["phase", "cake ms", "cake TFLOP/s"]
    for a in anchors:
        cols += [f"{a} ms", f"{a} TFLOP/s", f"cake/{a}"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]

    def cells(t):
        return ([f"{t['ms']:.3f}", f"{t['tflops']:.1f}"] if "ms" in t
                else [t.get("error", "?")[:80], ""])

    for ph, row in res["phases"].items():
        c = [ph, *cells(row["cake"])]
        for a in anchors:
            r = row["ratios"].get(a)
            c += [*cells(row[a]), f"{r:.2f}" if r is not None else ""]
        lines.append("| " + " | ".join(c) + " |")
    if "rel_err" in res:
        errs = ", ".join(f"{k} {v:.2e}" for k, v in res["rel_err"].items())
        lines += ["", f"rel. error vs float64: {errs}; wgrad bitwise repeat: "
                      f"{res['wgrad_bitwise_repeat']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    triton = bench.import_triton()  # cake picks CUDA or the interpreter first
    if bench.cuda_missing(args.device):
        return 2
    desc = bench.device_description(args.device)
    cpu = args.device == "cpu"
    if not cpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    else:
        desc += ", Triton interpreter"
    experts = args.experts or (QUICK_CPU["experts"] if cpu else DEFAULT_EXPERTS)
    nks = args.nk or (QUICK_CPU["nk"] if cpu else DEFAULT_NK)
    tokens = args.tokens or (QUICK_CPU["tokens"] if cpu else DEFAULT_TOKENS)
    top_k = args.top_k or (QUICK_CPU["top_k"] if cpu else DEFAULT_TOP_K)
    routings = [r for r in args.routings.split(",") if r]
    for r in routings:
        if r not in ROUTINGS:
            print(f"--routings: unknown {r!r}", file=sys.stderr)
            return 2
    dtype = getattr(torch, DTYPES[args.dtype])
    timer = Timer(args.device, args.quick, args.warmup, args.rep, cpu_quick=(0, 1),
                  cpu_full=(1, 3))
    meta = {"date": bench.utc_now(), "device": desc, "python": sys.version.split()[0],
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "dtype": args.dtype, "tokens": tokens,
            "top_k": top_k, "grouped_mm": _grouped_mm() is not None, "timer": timer.kind,
            "warmup": timer.warmup, "rep": timer.rep,
            "argv": sys.argv if argv is None else argv}
    print(f"## cake-moe-grouped-det-gemm vs torch._grouped_mm ({desc}, {args.dtype})\n",
          flush=True)
    payload: dict[str, Any] = {"meta": meta, "results": []}
    for E in experts:
        for N, K in nks:
            for routing in routings:
                try:
                    res = run_case(E, N, K, routing, tokens, top_k, dtype, args.device, timer,
                                   not args.no_check, args.loop_anchor,
                                   bench.parse_overrides(args.plan))
                except Exception as exc:  # noqa: BLE001 - e.g. OOM; recorded, next case runs
                    res = {"E": E, "N": N, "K": K, "routing": routing, "status": "error",
                           "error": bench.short_error(exc, 300)}
                    print(f"### E={E} N={N} K={K} {routing}: failed: {res['error']}\n",
                          flush=True)
                else:
                    print(markdown_case(res) + "\n", flush=True)
                payload["results"].append(res)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(payload, f, indent=1)
                if not cpu:
                    torch.cuda.empty_cache()
    return 0 if all(r.get("status") != "error" for r in payload["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
