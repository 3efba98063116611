"""Benchmark cake's det chunked Kimi Delta Attention against FLA's ``chunk_kda``.

    python benchmarks/bench_cake_kda_det_train.py [--impls cake,fla] [--cases a,b,c]
        [--in-kernel] [--plan key=val ...] [--err] [--hash] [--profile CASE [--profile-fwd]]
        [--out f.json]

Cases (the issue's shapes; bf16 q/k/v, fp32 per-channel g, K = V = 128, HV = H):

* ``a``: B=4, T=4096, H=16
* ``b``: B=2, T=8192, H=32
* ``c``: B=1, T=32768 packed as 8 documents of random lengths (seed 0), H=32

Inputs: k L2-normalised outside the kernel, g = logsigmoid(randn) per channel (about -0.7),
beta = sigmoid(randn); with ``--in-kernel`` both implementations get unnormalised q/k, the
raw gate (randn), A_log, dt_bias and pre-sigmoid beta, and run FLA's in-kernel L2 norm,
gate and beta sigmoid. Per case and implementation: forward (autograd forward, inputs
requiring grad), backward (``torch.autograd.backward`` of (o, final_state) with fixed
upstream gradients) and forward+backward, each the median of CUDA-event times over
``--reps`` runs after warm-up, and the first call (compile and, for FLA, autotune
included). Ratios are cake / FLA (below 1: cake faster). ``--plan`` replaces fields of
cake's plan.

``--err``: both implementations against the float64 token-by-token recurrence
(:func:`cake_kda_det_train.kda_recurrence_ref`) on a smaller shape, fixed length and
packed (max |err| / max |ref| per tensor). ``--hash``: sha256 of o, final_state and all
gradients over 5 runs per implementation (run the script twice to compare processes).
``--profile CASE``: torch.profiler's table of CUDA kernels over 3 forward+backward steps
(the forward's prep, pairs and state kernels run again in the backward's recompute), or
over 3 forwards with ``--profile-fwd``.
FLA is imported only when asked for and never required: without it, cake runs alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.nn.functional as F
from cake_core import bench

CASES = {
    "a": dict(B=4, T=4096, H=16, docs=None),
    "b": dict(B=2, T=8192, H=32, docs=None),
    "c": dict(B=1, T=32768, H=32, docs="random8"),
}
LEAVES = ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
NAMES = ("o", "final_state") + tuple("d" + n for n in LEAVES)
DEV = "cuda"  # the module-level device (a CPU smoke run may set it to "cpu")


def make_case(B, T, H, docs, K=128, V=128, dtype=torch.bfloat16, dev=None, seed=0,
              in_kernel=False):
    dev = dev or DEV
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    HV = H
    q = rn(B, T, H, K).to(dtype)
    k = rn(B, T, H, K)
    k = (k if in_kernel else F.normalize(k, dim=-1)).to(dtype)
    v = rn(B, T, HV, V).to(dtype)
    g = rn(B, T, HV, K) if in_kernel else F.logsigmoid(rn(B, T, HV, K))
    beta = rn(B, T, HV) if in_kernel else torch.sigmoid(rn(B, T, HV))
    beta = beta.to(dtype)
    cu = None
    if docs == "random8":
        cuts = torch.randperm(T - 1, generator=gen)[:7].add(1).sort().values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(torch.int32)
    N = B if cu is None else len(cu) - 1
    h0 = 0.1 * rn(N, HV, K, V)
    c = dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu=cu.to(dev) if cu is not None else None,
             do=rn(B, T, HV, V).to(dtype), dht=0.1 * rn(N, HV, K, V), in_kernel=in_kernel,
             A_log=None, dt_bias=None)
    if in_kernel:
        c["A_log"] = 0.5 * rn(HV) - 0.5
        c["dt_bias"] = 0.5 * rn(HV * K)
    return c


def _opts(c, x):
    if not c["in_kernel"]:
        return {}
    return dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["A_log"],
                dt_bias=x["dt_bias"], use_beta_sigmoid_in_kernel=True)


def cake_fn(plan_over):
    from cake_kda_det_train import chunk_kda_det, make_plan

    plans = {}  # one plan per (K, V, dtype, device): a variant's host work is not timed

    def run(c, x):
        q = x["q"]
        key = (q.shape[-1], x["v"].shape[-1], q.dtype, q.device)
        if key not in plans:
            plan = make_plan(*key)
            plans[key] = dataclasses.replace(plan, **plan_over) if plan_over else plan
        plan = plans[key]
        return chunk_kda_det(q, x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                             output_final_state=True, cu_seqlens=c["cu"], plan=plan,
                             **_opts(c, x))
    return run


def fla_fn():
    from fla.ops.kda import chunk_kda  # lazily: FLA is never required

    def run(c, x):
        cu = c["cu"].long() if c["cu"] is not None else None
        return chunk_kda(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"],
                         initial_state=x["h0"], output_final_state=True, cu_seqlens=cu,
                         **_opts(c, x))
    return run


def leaves(c, dtype=None):
    out = {}
    for name in LEAVES:
        t = c[name]
        if t is not None:
            t = t.detach().clone() if dtype is None else t.detach().to(dtype)
            t.requires_grad_()
        out[name] = t
    return out


def grads_of(fn, c):
    x = leaves(c)
    o, ht = fn(c, x)
    torch.autograd.backward([o, ht], [c["do"], c["dht"]])
    return [o, ht] + [x[n].grad if x[n] is not None else None for n in LEAVES]


def time_impl(fn, c, reps):
    x = leaves(c)
    return bench.time_fwd_bwd(lambda: fn(c, x), [c["do"], c["dht"]], reps,
                              first_call=lambda: grads_of(fn, c))


def errors(impls, in_kernel, T=1000, K=128):
    """max |err| / max |ref| per tensor against float64 autograd through the reference."""
    from cake_kda_det_train import kda_recurrence_ref
    c = make_case(B=1, T=T, H=2, docs=None, in_kernel=in_kernel, K=K, V=K)
    cuts = [0, 1, 63, 64, 330, 600, 1000] if T == 1000 else [0, 1, T // 2, T]
    cu = torch.tensor(cuts, dtype=torch.int32, device=DEV)
    h0_1, dht_1 = c["h0"][:1], c["dht"][:1]
    res = {}
    for cu_name, cu_t in (("fixed", None), ("varlen", cu)):
        n = 1 if cu_t is None else len(cu_t) - 1
        cc = dict(c, cu=cu_t, h0=h0_1.expand(n, -1, -1, -1).contiguous(),
                  dht=dht_1.expand(n, -1, -1, -1).contiguous())
        x = leaves(cc, torch.float64)
        o, ht = kda_recurrence_ref(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                   initial_state=x["h0"], output_final_state=True,
                                   cu_seqlens=cu_t, dtype=torch.float64, **_opts(cc, x))
        torch.autograd.backward([o, ht], [cc["do"].double(), cc["dht"].double()])
        ref = [o, ht] + [x[n].grad if x[n] is not None else None for n in LEAVES]
        for name, fn in impls.items():
            key = f"{name}/{cu_name}"
            try:
                got = grads_of(fn, cc)
                res[key] = {n: bench.max_rel_error(a, r)
                            for n, a, r in zip(NAMES, got, ref, strict=True)
                            if a is not None and r is not None}
            except Exception as e:  # noqa: BLE001 - recorded, not fatal
                res[key] = f"failed: {type(e).__name__}: {e}"[:300]
            print(f"err {key}: {res[key]}", flush=True)
    return res


def hashes(fn, c, runs=5):
    return bench.repeat_hashes(lambda: grads_of(fn, c), NAMES, runs)


def profile(fn, c, fwd_only=False):
    if fwd_only:  # the autograd forward alone (inputs requiring grad, as when timed)
        x = leaves(c)
        print(bench.cuda_profile_table(lambda: fn(c, x)))
    else:
        print(bench.cuda_profile_table(lambda: grads_of(fn, c)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impls", default="cake,fla")
    p.add_argument("--cases", default="a,b,c")
    p.add_argument("--in-kernel", action="store_true",
                   help="in-kernel L2 norm, gate (A_log, dt_bias) and beta sigmoid")
    p.add_argument("--plan", nargs="*", default=[], help="cake plan overrides key=int")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--err", action="store_true")
    p.add_argument("--hash", action="store_true")
    p.add_argument("--profile", default="")
    p.add_argument("--profile-fwd", action="store_true",
                   help="with --profile: profile the forward only (no backward)")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args()
    over = bench.parse_overrides(a.plan)
    impls = bench.load_impls(a.impls.split(","),
                             lambda name: cake_fn(over) if name == "cake" else fla_fn())
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(), "plan over", over,
          "in-kernel", a.in_kernel, flush=True)
    result = {"plan_over": over, "in_kernel": a.in_kernel, "cases": {}}
    if a.err:
        result["err"] = errors(impls, a.in_kernel)
    result["cases"] = bench.compare_cases(
        [s for s in a.cases.split(",") if s],
        lambda name: make_case(**CASES[name], in_kernel=a.in_kernel), impls,
        time_impl=None if a.no_time else (lambda fn, c: time_impl(fn, c, a.reps)),
        hashes=hashes if a.hash else None,
        profile=lambda fn, c: profile(fn, c, a.profile_fwd), profile_case=a.profile)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
