"""Issue 46 probes on one GPU: the MoE wgrad's tiles against torch._grouped_mm, and where the
LM-head loss's fwd+bwd time goes, kernel by kernel.

    python shared/gpu/issue46_probe.py moe [--quick] [--ab] [--out F.json]
    python shared/gpu/issue46_probe.py lmhead [--out F.json]

``moe``: the benchmark's grid (E 8 / 64 / 128; (N, K) (3072, 4096) and (4096, 1536); 16384
tokens x top-8; balanced and skewed routing; bf16). Per case the wgrad of torch._grouped_mm
beside cake's rule plan and the 128 x 128 tiles it replaced, each a
``triton.testing.do_bench`` median (``--ab``: the rule and torch alone, 5 rounds in
rotating order, the median of the rounds). Both plans are first checked against a float64
wgrad on a small ragged case (relative Frobenius error), repeated bitwise and compared with
the rule's bits. The other candidates of issue 46's sweep (docs/benchmarks/moe.md) were
deleted with the experiment; their rows are in the json files there.

``lmhead``: T 4096, H 4096, V 128256, bf16, mean loss, fwd + ``torch.autograd.grad`` to
hidden and weight under ``torch.profiler``: device time per kernel; the three GEMMs alone on
cuBLAS beside it (the floor).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import sys

import torch
import triton

ARGS = sys.argv[1:]
MODE = ARGS[0] if ARGS else "moe"
QUICK = "--quick" in ARGS
OUT = ARGS[ARGS.index("--out") + 1] if "--out" in ARGS else None
AB = "--ab" in ARGS  # the rule against torch alone
ROUNDS = 5 if AB else 1


def bench(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=25, rep=rep)


# ------------------------------------------------------------------------------- MoE wgrad


#: (name, plan fields replaced): the rule, and the tiles it replaced (for the ratio's sake)
MOE_VARIANTS = [("rule", {}), ("128x128", {"wgrad_block_n": 128})]


def moe_main():
    sys.path.insert(0, "packages/cake-moe-grouped-det-gemm/benchmarks")
    from bench_cake_moe_grouped_det_gemm import group_sizes
    from cake_moe_grouped_det_gemm import make_plan
    from cake_moe_grouped_det_gemm.api import _launch_wgrad, _row_ends

    dev, dt = "cuda", torch.bfloat16
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "checks": [], "cases": []}

    # every variant on a small ragged case: float64 reference, repeat, the rule's bits
    sizes = [700, 0, 1, 64, 129, 2000, 63, 3000]
    E, N, K = len(sizes), 512, 384
    M = sum(sizes)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(M, K, device=dev, dtype=dt, generator=g)
    dy = torch.randn(M, N, device=dev, dtype=dt, generator=g)
    ends = _row_ends(torch.tensor(sizes).cumsum(0).to(torch.int32).to(dev), None, M)
    b = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    ref = torch.stack([dy[b[e]:b[e + 1]].double().t() @ x[b[e]:b[e + 1]].double()
                       for e in range(E)])
    base = dataclasses.replace(make_plan(131072, E, N, K, dt, dev), wgrad_splits=1)
    rule_out = None
    for name, over in MOE_VARIANTS:
        plan = dataclasses.replace(base, **over)
        outs = []
        for _ in range(2):
            dw = torch.full((E, N, K), float("nan"), device=dev, dtype=dt)
            _launch_wgrad(dy, x, ends, plan, dw, None, False)
            outs.append(dw)
        rule_out = outs[0] if rule_out is None else rule_out
        row = {"variant": name, "rel_err": ((outs[0].double() - ref).norm() / ref.norm()).item(),
               "repeat": bool(torch.equal(outs[0], outs[1])),
               "bits_equal_rule": bool(torch.equal(outs[0], rule_out))}
        res["checks"].append(row)
        print(f"check {row}", flush=True)

    for E in ((8, 64) if QUICK else (8, 64, 128)):
        for N, K in ((3072, 4096), (4096, 1536)):
            for routing in ("balanced", "skewed"):
                M = 16384 * 8
                sizes = group_sizes(M, E, routing)
                g = torch.Generator(device=dev).manual_seed(0)
                x = torch.randn(M, K, device=dev, dtype=dt, generator=g)
                dy = torch.randn(M, N, device=dev, dtype=dt, generator=g)
                offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
                ends = _row_ends(offs, None, M)
                rule = make_plan(M, E, N, K, dt, dev)
                fns = {"torch": lambda: torch._grouped_mm(dy.t(), x, offs=offs)}
                for name, over in MOE_VARIANTS[:1] if AB else MOE_VARIANTS:
                    plan = dataclasses.replace(rule, **over)
                    dw = torch.empty((E, N, K), device=dev, dtype=dt)
                    fns[name] = lambda p=plan, o=dw: _launch_wgrad(dy, x, ends, p, o, None, False)
                # ROUNDS rounds, the order rotated each round (clock and heat drift shared)
                times = {k: [] for k in fns}
                names = list(fns)
                for r in range(ROUNDS):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        times[name].append(bench(fns[name]))
                row = {"E": E, "N": N, "K": K, "routing": routing, "rounds": times,
                       "ms": {k: sorted(v)[len(v) // 2] for k, v in times.items()}}
                tt = row["ms"]["torch"]
                print(f"E {E:3d} {N}x{K} {routing:8s} torch {tt:.3f} ms "
                      f"({2.0 * M * N * K / tt / 1e9:.0f} TF/s) | " + "  ".join(
                          f"{k} {v / tt:.3f}" for k, v in row["ms"].items() if k != "torch"),
                      flush=True)
                res["cases"].append(row)
                del x, dy
    return res


# ------------------------------------------------------------------------------- LM head


def lmhead_main():
    from cake_lm_head_loss_det_train import lm_head_loss_det, make_plan

    T, H, V = 4096, 4096, 128256
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    h = (torch.randn(T, H, device=dev, dtype=dt, generator=g)).requires_grad_()
    w = (torch.randn(V, H, device=dev, dtype=dt, generator=g) * H ** -0.5).requires_grad_()
    lab = torch.randint(0, V, (T,), device=dev, generator=g)
    plan = make_plan(H, V, dt, dev)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "plan": str(plan)}

    def step():
        loss = lm_head_loss_det(h, w, lab)
        return torch.autograd.grad(loss, (h, w))

    res["fwd_bwd_ms"] = bench(step)
    hf = h.detach()
    wf = w.detach()
    dl = torch.randn(T, V, device=dev, dtype=dt, generator=g)
    res["floor_ms"] = {
        "logits fp32 out": bench(lambda: torch.mm(hf, wf.t(), out_dtype=torch.float32)),
        "dhidden": bench(lambda: dl @ wf),
        "dweight": bench(lambda: dl.t() @ hf),
    }
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    with prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = ev.name[:90]
            per[k][0] += 1
            per[k][1] += ev.device_time_total if hasattr(ev, "device_time_total") else \
                ev.cuda_time_total
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])
    res["kernels"] = [{"name": k, "calls_per_step": c / 3, "us_per_step": t / 3}
                      for k, (c, t) in rows]
    tot = sum(t for _, (_, t) in rows) / 3
    # the timeline: gaps between consecutive kernels (device idle), with their neighbours
    kev = sorted((ev for ev in prof.events()
                  if ev.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda ev: ev.time_range.start)
    gaps = []
    for a, b in zip(kev, kev[1:], strict=False):
        gap = b.time_range.start - a.time_range.end
        if gap > 5:
            gaps.append((gap, a.name[:50], b.name[:50]))
    span = (kev[-1].time_range.end - kev[0].time_range.start) / 3
    res["span_us_per_step"] = span
    res["gaps"] = sorted(gaps, reverse=True)[:30]
    print(f"lmhead timeline: {span / 1e3:.3f} ms per step first kernel to last; gaps > 5 us: "
          f"{len(gaps)}, {sum(g for g, _, _ in gaps) / 3 / 1e3:.3f} ms per step", flush=True)
    for g_, a, b in res["gaps"][:15]:
        print(f"  gap {g_:8.1f} us after {a} before {b}")
    try:  # the step captured in a CUDA graph: device time without host gaps
        static = {}
        s_ = torch.cuda.Stream()
        s_.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s_):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s_)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static["g"] = step()
        res["graph_ms"] = bench(graph.replay)
        print(f"lmhead fwd+bwd in a CUDA graph: {res['graph_ms']:.3f} ms", flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded
        res["graph_ms"] = str(exc)[:300]
        print("graph:", str(exc)[:300], flush=True)
    print(f"lmhead fwd+bwd {res['fwd_bwd_ms']:.3f} ms; floor "
          f"{sum(res['floor_ms'].values()):.3f} ({res['floor_ms']}); profiled device "
          f"{tot / 1e3:.3f} ms/step", flush=True)
    for r in res["kernels"][:20]:
        print(f"  {r['us_per_step']:9.1f} us  x{r['calls_per_step']:5.1f}  {r['name']}")
    return res


if __name__ == "__main__":
    out = moe_main() if MODE == "moe" else lmhead_main()
    if OUT:
        with open(OUT, "w") as f:
            json.dump(out, f, indent=1)
