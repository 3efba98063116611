"""Benchmark cake's det chunked Gated DeltaNet against FLA's ``chunk_gated_delta_rule``.

    python benchmarks/bench_cake_gdn_det_train.py [--impls cake,fla] [--cases ...]
        [--plan key=val ...] [--err] [--hash] [--profile CASE] [--out file.json]

Cases (the issue's shapes; bf16, K = V = 128, k L2-normalised outside the kernel):

* ``a``: B=1, T=32768, H=16, HV=32
* ``b``: B=1, T=32768 packed as 8 x 4096 (``cu_seqlens``), H=HV=16
* ``c``: B=1, T=32768 packed as 8 documents of random lengths (seed 0), H=16, HV=32
* ``d``: B=4, T=4096, H=HV=16

Per case and implementation: forward (autograd forward, inputs requiring grad), backward
(``torch.autograd.backward`` of (o, final_state) with fixed upstream gradients) and
forward+backward, each the median of CUDA-event times over ``--reps`` runs after warm-up,
and the first call (compile and, for FLA, autotune included). Ratios are cake / FLA
(below 1: cake faster). ``--plan`` replaces fields of cake's plan (``block_v=32``, ...).

FLA refuses its backward on Hopper with Triton 3.4 to 3.7.0 (it cites a miscompile of its
``chunk_bwd_dqkwg`` kernel); ``--fla-bypass`` (default on) lifts that guard so it can be
timed, and ``--err`` shows what its gradients are then worth: both implementations against
the float64 token-by-token recurrence on a smaller shape (max |err| / max |ref| per tensor).
``--hash`` prints sha256 of o, final_state and all gradients over 5 runs per
implementation (run twice, in two processes, to compare across processes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch
import torch.nn.functional as F
from cake_core import bench

CASES = {
    "a": dict(B=1, T=32768, H=16, HV=32, docs=None),
    "b": dict(B=1, T=32768, H=16, HV=16, docs="even8"),
    "c": dict(B=1, T=32768, H=16, HV=32, docs="random8"),
    "d": dict(B=4, T=4096, H=16, HV=16, docs=None),
}


def make_case(B, T, H, HV, docs, K=128, V=128, dtype=torch.bfloat16, dev="cuda", seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    q = rn(B, T, H, K).to(dtype)
    k = F.normalize(rn(B, T, H, K), dim=-1).to(dtype)
    v = rn(B, T, HV, V).to(dtype)
    g = F.logsigmoid(rn(B, T, HV)).to(dtype)
    beta = torch.sigmoid(rn(B, T, HV)).to(dtype)
    cu = None
    if docs == "even8":
        cu = torch.arange(0, T + 1, T // 8, dtype=torch.int32)
    elif docs == "random8":
        cuts = torch.randperm(T - 1, generator=gen)[:7].add(1).sort().values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(torch.int32)
    N = B if cu is None else len(cu) - 1
    h0 = 0.1 * rn(N, HV, K, V)
    cu = cu.to(dev) if cu is not None else None
    do = rn(B, T, HV, V).to(dtype)
    dht = 0.1 * rn(N, HV, K, V)
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu=cu, do=do, dht=dht)


def cake_fn(plan_over, l2norm: bool = False):
    """cake's entry with the rule's plan (``plan_over`` applied); ``l2norm``: the q / k L2
    norm in the kernel, as Qwen3-Next calls it."""
    from cake_gdn_det_train import chunk_gated_delta_rule_det, make_plan

    plans = {}  # one plan object per key: a variant's host work (a new plan) is not timed

    def run(q, k, v, g, beta, h0, cu):
        # the plan the entry picks with plan=None: the rule with state_programs = N * HV
        n = q.shape[0] if cu is None else cu.numel() - 1
        key = (q.shape[-1], v.shape[-1], q.dtype, q.device, n * v.shape[2])
        if key not in plans:
            plan = make_plan(*key[:4], state_programs=key[4])
            plans[key] = dataclasses.replace(plan, **plan_over) if plan_over else plan
        plan = plans[key]
        return chunk_gated_delta_rule_det(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu, plan=plan,
                                          use_qk_l2norm_in_kernel=l2norm)
    return run


def fla_fn(bypass):
    # FLA >= 0.6 hands bf16 K = V = 128 calls to FlashQLA on Hopper: time FLA's own kernels
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    if bypass:
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True

    def run(q, k, v, g, beta, h0, cu):
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                      output_final_state=True,
                                      cu_seqlens=cu.long() if cu is not None else None)
    return run


def leaves(c):
    out = {}
    for name in ("q", "k", "v", "g", "beta", "h0"):
        out[name] = c[name].detach().clone().requires_grad_()
    return out


def step(fn, c, x):
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"], c["cu"])
    return o, ht


def grads_of(fn, c):
    x = leaves(c)
    o, ht = step(fn, c, x)
    torch.autograd.backward([o, ht], [c["do"], c["dht"]])
    return [o, ht] + [x[n].grad for n in ("q", "k", "v", "g", "beta", "h0")]


def time_impl(fn, c, reps):
    x = leaves(c)
    return bench.time_fwd_bwd(lambda: step(fn, c, x), [c["do"], c["dht"]], reps,
                              first_call=lambda: grads_of(fn, c))


NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")


def errors(impls):
    from cake_gdn_det_train import gdn_reference
    c = make_case(B=1, T=1000, H=2, HV=4, docs=None)
    cu = torch.tensor([0, 1, 63, 64, 330, 600, 1000], dtype=torch.int32, device="cuda")
    c["h0"] = c["h0"][:1].expand(6, -1, -1, -1).contiguous()
    c["dht"] = c["dht"][:1].expand(6, -1, -1, -1).contiguous()
    res = {}
    for cu_name, cu_t in (("fixed", None), ("varlen", cu)):
        cc = dict(c, cu=cu_t)
        if cu_t is None:
            cc["h0"], cc["dht"] = c["h0"][:1], c["dht"][:1]
        x = {n: t.detach().double().requires_grad_() for n, t in leaves(cc).items()}
        o, ht = gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                              output_final_state=True, cu_seqlens=cu_t, dtype=torch.float64)
        torch.autograd.backward([o, ht], [cc["do"].double(), cc["dht"].double()])
        ref = [o, ht] + [x[n].grad for n in ("q", "k", "v", "g", "beta", "h0")]
        for name, fn in impls.items():
            try:
                got = grads_of(fn, cc)
                res[f"{name}/{cu_name}"] = {
                    n: bench.max_rel_error(a, r) for n, a, r in zip(NAMES, got, ref, strict=True)}
            except Exception as e:  # noqa: BLE001 - recorded, not fatal
                res[f"{name}/{cu_name}"] = f"failed: {type(e).__name__}: {e}"[:300]
            print(f"err {name}/{cu_name}: {res[f'{name}/{cu_name}']}", flush=True)
    return res


def hashes(fn, c, runs=5):
    return bench.repeat_hashes(lambda: grads_of(fn, c), NAMES, runs)


def profile(fn, c):
    x = leaves(c)
    print(bench.cuda_profile_table(
        lambda: torch.autograd.backward(list(step(fn, c, x)), [c["do"], c["dht"]])))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impls", default="cake,fla")
    p.add_argument("--cases", default="a,b,c,d")
    p.add_argument("--plan", nargs="*", default=[], help="cake plan overrides key=int")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--err", action="store_true")
    p.add_argument("--err-impls", default="", help="implementations for --err (default all)")
    p.add_argument("--hash", action="store_true")
    p.add_argument("--profile", default="")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--fla-bypass", type=int, default=1)
    p.add_argument("--out", default="")
    a = p.parse_args()
    over = bench.parse_overrides(a.plan)
    impls = bench.load_impls(a.impls.split(","), lambda name: cake_fn(over) if name == "cake"
                             else fla_fn(a.fla_bypass))
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(), "plan over", over,
          flush=True)
    result = {"plan_over": over, "cases": {}}
    if a.err:
        pick = a.err_impls.split(",") if a.err_impls else list(impls)
        result["err"] = errors({n: f for n, f in impls.items() if n in pick})
    result["cases"] = bench.compare_cases(
        [s for s in a.cases.split(",") if s], lambda name: make_case(**CASES[name]), impls,
        time_impl=None if a.no_time else (lambda fn, c: time_impl(fn, c, a.reps)),
        hashes=hashes if a.hash else None, profile=profile, profile_case=a.profile)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
