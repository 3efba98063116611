"""Issue 46 probes on one GPU: the MoE wgrad's tiles against torch._grouped_mm, and where the
LM-head loss's fwd+bwd time goes, kernel by kernel.

    python shared/gpu/issue46_probe.py moe [--quick] [--ab] [--out F.json]
    python shared/gpu/issue46_probe.py lmhead [--out F.json]

``moe``: the benchmark's grid (E 8 / 64 / 128; (N, K) (3072, 4096) and (4096, 1536); 16384
tokens x top-8; balanced and skewed routing; bf16). Per case the wgrad of torch._grouped_mm
and of cake's rule plan with tile variants (``dataclasses.replace`` on the plan) and two
variants of the TMA wgrad kernel defined here (``ws``: the row loop warp-specialized;
``persist``: one program per SM looping over the tiles, output stored through a TMA
descriptor, plain / flattened / warp-specialized loops), each
a ``triton.testing.do_bench`` median (``--ab``: the rule and torch alone, 5 rounds in
rotating order, the median of the rounds). Every variant is checked against a float64 wgrad on a
small case (relative Frobenius error) and repeated bitwise.

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
import triton.language as tl

ARGS = sys.argv[1:]
MODE = ARGS[0] if ARGS else "moe"
QUICK = "--quick" in ARGS
OUT = ARGS[ARGS.index("--out") + 1] if "--out" in ARGS else None
AB = "--ab" in ARGS  # the rule against torch alone
ROUNDS = 5 if AB else 1


def bench(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=25, rep=rep)


# ------------------------------------------------------------------------------- MoE wgrad


from cake_moe_grouped_det_gemm.kernels.grouped import _mma, _wgrad_slice  # noqa: E402


def _kernels():
    @triton.jit
    def wgrad_var_kernel(
        DY_DESC, X_DESC, OUT, ENDS, ORDER, N, K, n_tiles_n, n_tiles_k,
        stride_os, stride_oe, stride_on, stride_ok,
        SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        REORDER: tl.constexpr, WS: tl.constexpr, SWZ: tl.constexpr,
    ):
        pid = tl.program_id(0)
        s = tl.program_id(1)
        e, pid_n, pid_k, lo, hi = _wgrad_slice(ENDS, ORDER, pid, s, n_tiles_n, n_tiles_k,
                                               SPLIT, BLOCK_K, REORDER)
        if SWZ > 1:  # tiles of one expert in groups of SWZ row tiles (column-major inside)
            rest = pid_n * n_tiles_k + pid_k
            per_g = SWZ * n_tiles_k
            g0 = (rest // per_g) * SWZ
            gs = tl.minimum(n_tiles_n - g0, SWZ)
            pid_n = g0 + (rest % per_g) % gs
            pid_k = (rest % per_g) // gs
        r_full = lo + tl.maximum(hi - lo, 0) // BLOCK_K * BLOCK_K
        n0 = pid_n * BLOCK_M
        k0 = pid_k * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for r0 in tl.range(lo, r_full, BLOCK_K, warp_specialize=WS):
            a = tl.trans(DY_DESC.load([r0, n0]))
            b = X_DESC.load([r0, k0])
            acc = _mma(a, b, acc, IEEE)
        if r_full < hi:
            keep = (r_full + tl.arange(0, BLOCK_K)) < hi
            a = DY_DESC.load([r_full, n0])
            a = tl.trans(tl.where(keep[:, None], a, tl.zeros_like(a)))
            b = X_DESC.load([r_full, k0])
            b = tl.where(keep[:, None], b, tl.zeros_like(b))
            acc = _mma(a, b, acc, IEEE)
        rn = (n0 + tl.arange(0, BLOCK_M)).to(tl.int64)
        rk = (k0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        o_ptrs = (OUT + s.to(tl.int64) * stride_os + e.to(tl.int64) * stride_oe
                  + rn[:, None] * stride_on + rk[None, :] * stride_ok)
        omask = (rn < N)[:, None] & (rk < K)[None, :]
        tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=omask)

    @triton.jit
    def wgrad_persist_kernel(
        DY_DESC, X_DESC, OUT_DESC, ENDS, ORDER, N, K, n_tiles_n, n_tiles_k, total,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        NUM_PROGS: tl.constexpr, FLAT: tl.constexpr, WS: tl.constexpr,
    ):
        # persistent: program p computes tiles p, p + NUM_PROGS, ... (the grouped order);
        # the output through a 3-D TMA descriptor over dW [E, N, K]
        for tile in tl.range(tl.program_id(0), total, NUM_PROGS, flatten=FLAT,
                             warp_specialize=WS):
            e, pid_n, pid_k, lo, hi = _wgrad_slice(ENDS, ORDER, tile, 0, n_tiles_n,
                                                   n_tiles_k, 1, BLOCK_K, True)
            r_full = lo + tl.maximum(hi - lo, 0) // BLOCK_K * BLOCK_K
            n0 = pid_n * BLOCK_M
            k0 = pid_k * BLOCK_N
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for r0 in range(lo, r_full, BLOCK_K):
                a = tl.trans(DY_DESC.load([r0, n0]))
                b = X_DESC.load([r0, k0])
                acc = _mma(a, b, acc, False)
            if r_full < hi:
                keep = (r_full + tl.arange(0, BLOCK_K)) < hi
                a = DY_DESC.load([r_full, n0])
                a = tl.trans(tl.where(keep[:, None], a, tl.zeros_like(a)))
                b = X_DESC.load([r_full, k0])
                b = tl.where(keep[:, None], b, tl.zeros_like(b))
                acc = _mma(a, b, acc, False)
            OUT_DESC.store([e, n0, k0], tl.reshape(acc.to(tl.bfloat16),
                                                   [1, BLOCK_M, BLOCK_N]))

    return wgrad_var_kernel, wgrad_persist_kernel


#: (name, plan fields replaced, kernel variant (ws, swz) or None for the package's kernel)
MOE_VARIANTS = [
    ("rule", {}, None),
    ("128x128", {"wgrad_block_n": 128}, None),
    ("ws", {}, (True, 1)),
    ("persist", {}, ("persist", False, False)),
    ("persist flat", {}, ("persist", True, False)),
    ("persist ws", {}, ("persist", False, True)),
]


def make_runner(var_kernel, plan, variant, dy, x, ends, dw):
    from cake_core.triton_utils import cdiv
    from cake_moe_grouped_det_gemm.api import _desc, _expert_order, _launch_wgrad

    if variant is None:
        return lambda: _launch_wgrad(dy, x, ends, plan, dw, None, False)
    if variant[0] == "persist":
        from cake_core.triton_utils import sm_count

        _, flat, wsp = variant
        E, N, K = plan.num_experts, plan.out_features, plan.in_features
        wbm, wbn, wbk = plan.wgrad_block_m, plan.wgrad_block_n, plan.wgrad_block_k
        tn, tk = cdiv(N, wbm), cdiv(K, wbn)
        total = E * tn * tk
        progs = min(total, sm_count(dy.device))

        def run_p():
            order = _expert_order(ends)
            var_kernel[1][(progs,)](
                _desc(dy, [wbk, wbm]), _desc(x, [wbk, wbn]), _desc(dw, [1, wbm, wbn]), ends,
                order, N, K, tn, tk, total, BLOCK_M=wbm, BLOCK_N=wbn, BLOCK_K=wbk,
                NUM_PROGS=progs, FLAT=flat, WS=wsp, num_warps=plan.wgrad_num_warps,
                num_stages=plan.wgrad_num_stages)
        return run_p
    ws, swz = variant
    E, N, K = plan.num_experts, plan.out_features, plan.in_features
    wbm, wbn, wbk = plan.wgrad_block_m, plan.wgrad_block_n, plan.wgrad_block_k
    tn, tk = cdiv(N, wbm), cdiv(K, wbn)
    assert plan.wgrad_splits == 1

    def run():
        order = _expert_order(ends)
        var_kernel[0][(E * tn * tk, 1)](
            _desc(dy, [wbk, wbm]), _desc(x, [wbk, wbn]), dw, ends, order, N, K, tn, tk,
            0, *dw.stride(), SPLIT=1, ACCUMULATE=False, IEEE=False, BLOCK_M=wbm,
            BLOCK_N=wbn, BLOCK_K=wbk, REORDER=True, WS=ws, SWZ=swz,
            num_warps=plan.wgrad_num_warps, num_stages=plan.wgrad_num_stages)
    return run


def moe_main():
    sys.path.insert(0, "packages/cake-moe-grouped-det-gemm/benchmarks")
    from bench_cake_moe_grouped_det_gemm import group_sizes
    from cake_moe_grouped_det_gemm import make_plan
    from cake_moe_grouped_det_gemm.api import _row_ends

    var_kernel = _kernels()
    dev, dt = ("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "checks": [], "cases": []}

    # correctness of every variant on a small ragged case (float64 reference, repeat)
    sizes = [700, 0, 1, 64, 129, 2000, 63, 3000]
    E, N, K = len(sizes), 512, 384
    M = sum(sizes)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(M, K, device=dev, dtype=dt, generator=g)
    dy = torch.randn(M, N, device=dev, dtype=dt, generator=g)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32).to(dev)
    ends = _row_ends(offs, None, M)
    b = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    ref = torch.stack([dy[b[e]:b[e + 1]].double().t() @ x[b[e]:b[e + 1]].double()
                       for e in range(E)])
    base = make_plan(131072, E, N, K, dt, dev)
    base = dataclasses.replace(base, wgrad_splits=1)
    for name, over, variant in MOE_VARIANTS:
        try:
            plan = dataclasses.replace(base, **over)
            outs = []
            for _ in range(2):
                dw = torch.full((E, N, K), float("nan"), device=dev, dtype=dt)
                make_runner(var_kernel, plan, variant, dy, x, ends, dw)()
                outs.append(dw)
            err = ((outs[0].double() - ref).norm() / ref.norm()).item()
            rep = bool(torch.equal(outs[0], outs[1]))
            if name == "rule":
                rule_out = outs[0]
            same = bool(torch.equal(outs[0], rule_out))
            res["checks"].append({"variant": name, "rel_err": err, "repeat": rep,
                                  "bits_equal_rule": same})
            print(f"check {name:18s} rel_err {err:.2e} repeat {rep} rule's bits {same}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded
            res["checks"].append({"variant": name, "error": str(exc)[:300]})
            print(f"check {name:18s} ERROR {str(exc)[:200]}", flush=True)
    if dev == "cpu":  # the interpreter: the checks alone (a dry run of the script)
        return res
    bad = {c["variant"] for c in res["checks"] if "error" in c or c["rel_err"] > 1e-2}

    experts = (8, 64) if QUICK else (8, 64, 128)
    for E in experts:
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
                flops = 2.0 * M * N * K
                row = {"E": E, "N": N, "K": K, "routing": routing, "ms": {}}
                fns = {"torch": lambda: torch._grouped_mm(dy.t(), x, offs=offs)}
                for name, over, variant in MOE_VARIANTS:
                    if name in bad or (AB and name != "rule"):
                        continue
                    plan = dataclasses.replace(rule, **over)
                    if plan.wgrad_splits != 1:
                        continue
                    dw = torch.empty((E, N, K), device=dev, dtype=dt)
                    fns[name] = make_runner(var_kernel, plan, variant, dy, x, ends, dw)
                # ROUNDS rounds, the order rotated each round (clock and heat drift shared)
                times = {k: [] for k in fns}
                names = list(fns)
                for r in range(ROUNDS):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        try:
                            times[name].append(bench(fns[name]))
                        except Exception as exc:  # noqa: BLE001 - recorded
                            times[name] = str(exc)[:200]
                            break
                for k, v in times.items():
                    row["ms"][k] = sorted(v)[len(v) // 2] if isinstance(v, list) else v
                row["rounds"] = times
                tt = row["ms"]["torch"]
                print(f"E {E:3d} {N}x{K} {routing:8s} torch {tt:.3f} ms "
                      f"({flops / tt / 1e9:.0f} TF/s) | " + "  ".join(
                          f"{k} {v / tt:.3f}" if isinstance(v, float) else f"{k} ERR"
                          for k, v in row["ms"].items() if k != "torch"), flush=True)
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
