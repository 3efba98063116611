"""Benchmark cake's MoEFeedForward layer against the same layer written in eager torch.

Both compute the same math (``cake_moe_grouped_det_gemm.moe``'s docstring): fp32 router,
softmax, top-k with renormalised weights, SwiGLU experts, combine, load-balancing loss.

- ``cake``: :func:`cake_moe_grouped_det_gemm.moe_feed_forward_det` (the det grouped GEMM
  for router and experts, stable-sort permutation, slot-order combine).
- ``torch``: the usual eager recipe: ``torch.topk``, ``argsort`` of the expert ids,
  ``bincount`` offsets, ``torch._grouped_mm`` for the experts (a per-expert loop where it
  cannot run, e.g. on the CPU), and the combine by ``index_add_`` (atomic adds on CUDA).
  Timed without ``torch.use_deterministic_algorithms``, as users run it.

Per config: forward and forward+backward times (ratio cake / torch: below 1 means cake is
faster), the largest relative gap of y and every gradient between the two (``--check``,
default on; ties or near-ties in routing can make a few tokens differ), and whether two
runs give the same bits (sha256 over y, aux and the gradients) for each.

GPU (one H200; bf16)::

    cd packages/cake-moe-grouped-det-gemm/benchmarks
    PYTHONPATH=$(ls -d ../../*/src | paste -sd:) python3 bench_moe_layer.py \\
        --out $OUT/moe_layer.json

CPU smoke test (Triton interpreter, tiny shapes)::

    python3 .../bench_moe_layer.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cake_core import bench
from cake_core.bench import Timer

#: name -> (d_model, d_ff, num_experts, top_k)
CONFIGS = {
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "e64-k6": (2048, 1408, 64, 6),
}
DEFAULT_TOKENS = 8192
QUICK_CPU = {"configs": {"tiny": (24, 20, 4, 2)}, "tokens": 16}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write all results to this JSON file")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--configs", default=None,
                   help="comma-separated subset of " + ", ".join(CONFIGS))
    p.add_argument("--tokens", type=int, default=None, help=f"tokens ({DEFAULT_TOKENS})")
    p.add_argument("--quick", action="store_true", help="fewer warmup/rep (smoke test)")
    p.add_argument("--warmup", type=float, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=float, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--no-check", action="store_true", help="skip the gap and repeat checks")
    return p


def torch_moe(x, router_weight, w_gate_up, w_down, top_k, coef=0.01):
    """The eager torch MoE feed-forward (non-deterministic combine on CUDA)."""
    import torch
    import torch.nn.functional as F

    T, d = x.shape
    E, f = w_down.shape[0], w_down.shape[2]
    probs = torch.softmax(F.linear(x.float(), router_weight.float()), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    tok = torch.div(order, top_k, rounding_mode="floor")
    xp = x[tok]
    gmm = getattr(torch, "_grouped_mm", None)
    if x.device.type == "cuda" and gmm is not None:
        offs = counts.cumsum(0).to(torch.int32)
        h = gmm(xp, w_gate_up.transpose(-2, -1), offs=offs)
        o = gmm(F.silu(h[:, :f]) * h[:, f:], w_down.transpose(-2, -1), offs=offs)
    else:
        outs, start = [], 0
        for e, m in enumerate(counts.tolist()):
            h = xp[start:start + m] @ w_gate_up[e].t()
            outs.append((F.silu(h[:, :f]) * h[:, f:]) @ w_down[e].t())
            start += m
        o = torch.cat(outs)
    y = torch.zeros((T, d), dtype=torch.float32, device=x.device)
    y = y.index_add(0, tok, o.float() * w.reshape(-1)[order, None])
    aux = coef * E * (counts.float() / (T * top_k) * probs.mean(0)).sum()
    return y.to(x.dtype), aux


def run_case(name: str, d: int, f: int, E: int, k: int, tokens: int, dtype, device: str,
             timer: Timer, check: bool) -> dict[str, Any]:
    import torch
    from cake_moe_grouped_det_gemm import moe_feed_forward_det

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, d, device=device, dtype=dtype, generator=g)
    params = [
        (torch.randn(E, d, device=device, generator=g) * d ** -0.5).to(dtype),
        (torch.randn(E, 2 * f, d, device=device, generator=g) * d ** -0.5).to(dtype),
        (torch.randn(E, d, f, device=device, generator=g) * f ** -0.5).to(dtype),
    ]
    dy = torch.randn(tokens, d, device=device, dtype=dtype, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, *params)]
    impls = {"cake": lambda: moe_feed_forward_det(*leaves, k),
             "torch": lambda: torch_moe(*leaves, k)}
    one = torch.ones((), device=device)

    def step(fn):
        def run():
            for t in leaves:
                t.grad = None
            y, aux = fn()
            torch.autograd.backward((y, aux), (dy, one))
            return [y.detach(), aux.detach(), *[t.grad for t in leaves]]
        return run

    flops = 2.0 * tokens * k * 3 * d * f  # expert GEMMs only, forward
    res: dict[str, Any] = {"config": name, "d_model": d, "d_ff": f, "E": E, "top_k": k,
                           "tokens": tokens, "impls": {}}
    outs = {}
    for impl, fn in impls.items():
        row: dict[str, Any] = {}
        try:
            row["fwd"] = timer.bench(lambda fn=fn: fn())
            row["fwd_bwd"] = timer.bench(step(fn))
            row["fwd"]["expert_tflops"] = flops / (row["fwd"]["ms"] * 1e-3) / 1e12
            row["fwd_bwd"]["expert_tflops"] = 3 * flops / (row["fwd_bwd"]["ms"] * 1e-3) / 1e12
            if check:
                a, b = step(fn)(), step(fn)()
                outs[impl] = a
                row["bitwise_repeat"] = bench.bits_sha256(a) == bench.bits_sha256(b)
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            row["error"] = bench.short_error(exc, 300)
        res["impls"][impl] = row
    c, t = res["impls"]["cake"], res["impls"]["torch"]
    res["ratios"] = {ph: c[ph]["ms"] / t[ph]["ms"] for ph in ("fwd", "fwd_bwd")
                     if ph in c and ph in t}
    if len(outs) == 2:
        names = ("y", "aux", "dx", "drouter", "dw_gate_up", "dw_down")
        res["max_rel_gap"] = {n: bench.max_rel_error(a, b) for n, a, b in
                              zip(names, outs["cake"], outs["torch"], strict=True)}
    return res


def markdown_case(res: dict[str, Any]) -> str:
    head = (f"### {res['config']}: d_model={res['d_model']} d_ff={res['d_ff']} E={res['E']} "
            f"top-{res['top_k']}, {res['tokens']} tokens")
    lines = [head, "", "| impl | fwd ms | fwd+bwd ms | bitwise repeat |",
             "| --- | --- | --- | --- |"]
    for impl, row in res["impls"].items():
        if "error" in row:
            lines.append(f"| {impl} | {row['error'][:80]} | | |")
            continue
        lines.append(f"| {impl} | {row['fwd']['ms']:.3f} | {row['fwd_bwd']['ms']:.3f} | "
                     f"{row.get('bitwise_repeat', '')} |")
    if res.get("ratios"):
        lines += ["", "cake / torch: " + ", ".join(f"{k} {v:.2f}"
                                                   for k, v in res["ratios"].items())]
    if "max_rel_gap" in res:
        lines.append("max relative gap cake vs torch: " + ", ".join(
            f"{k} {v:.2e}" for k, v in res["max_rel_gap"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    triton = bench.import_triton()  # cake picks CUDA or the interpreter first
    if bench.cuda_missing(args.device):
        return 2
    cpu = args.device == "cpu"
    desc = bench.device_description(args.device) + (", Triton interpreter" if cpu else "")
    configs = QUICK_CPU["configs"] if cpu and args.configs is None else CONFIGS
    if args.configs:
        unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
        if unknown:
            print(f"--configs: unknown {unknown}", file=sys.stderr)
            return 2
        configs = {c: CONFIGS[c] for c in args.configs.split(",")}
    tokens = args.tokens or (QUICK_CPU["tokens"] if cpu else DEFAULT_TOKENS)
    dtype = getattr(torch, DTYPES[args.dtype])
    timer = Timer(args.device, args.quick, args.warmup, args.rep, cpu_quick=(0, 1),
                  cpu_full=(1, 3))
    meta = {"date": bench.utc_now(), "device": desc, "torch": torch.__version__,
            "triton": triton.__version__, "dtype": args.dtype, "tokens": tokens,
            "timer": timer.kind, "argv": sys.argv if argv is None else argv}
    print(f"## cake MoEFeedForward vs eager torch ({desc}, {args.dtype})\n", flush=True)
    payload: dict[str, Any] = {"meta": meta, "results": []}
    for name, (d, f, E, k) in configs.items():
        try:
            res = run_case(name, d, f, E, k, tokens, dtype, args.device, timer,
                           not args.no_check)
        except Exception as exc:  # noqa: BLE001 - e.g. OOM; recorded, next case runs
            res = {"config": name, "status": "error", "error": bench.short_error(exc, 300)}
            print(f"### {name}: failed: {res['error']}\n", flush=True)
        else:
            print(markdown_case(res) + "\n", flush=True)
        payload["results"].append(res)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(payload, fh, indent=1)
        if not cpu:
            torch.cuda.empty_cache()
    ok = all(r.get("status") != "error" and "error" not in r["impls"]["cake"]
             for r in payload["results"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
