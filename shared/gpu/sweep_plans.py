"""Sweep plan configurations of a memory-bound family on the GPU, side by side with its anchor.

    python shared/gpu/sweep_plans.py FAMILY [--compile-only] [--reps N] ["k=v k=v" ...]

FAMILY: rmsnorm (T x H in {32768x4096, 16384x8192, 65536x2048}, anchor Liger), conv (the
benchmark's cases a and b, W = 4, SiLU, anchor FLA's Triton causal_conv1d) or gate
(rows x 128 in {524288, 1048576}, FLA order, anchor FLA's rms_norm_gated). Each quoted
argument is one set of plan overrides applied to the rule's plan with
``dataclasses.replace``; none: a built-in list per family. Per shape and configuration:
fwd and fwd+bwd medians (``triton.testing.do_bench``, ms), the ratio to the anchor, the largest
difference of y and of every gradient to the rule's plan (max |diff| / max |rule|) and
whether two calls give the same bits. ``--compile-only`` runs each configuration once (to
fill Triton's cache from parallel processes before a timed pass). Plans the family refuses
print their ValueError. A developer tool (no wheel ships it); rules are changed by hand from
its output, never by timing at call time.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys

import torch
import triton.testing

DEFAULTS = {
    "rmsnorm": ["", "block_m_fwd=2", "num_warps_fwd=4", "num_warps_fwd=16",
                "block_m_fwd=2 num_warps_fwd=16", "block_m_fwd=4 num_warps_fwd=16",
                "block_m_fwd=2 num_warps_fwd=8", "num_warps_fwd=2"],
    "conv": ["", "block_t_fwd=128", "block_t_fwd=256", "block_t_fwd=128 block_d_fwd=128",
             "block_t_fwd=32 block_d_fwd=128", "block_d_fwd=128", "block_t_fwd=128 num_warps_fwd=4",
             "block_t_fwd=256 block_d_fwd=32", "block_t_fwd=128 block_d_fwd=32 num_warps_fwd=4",
             "block_t_bwd=128", "block_t_bwd=256", "block_d_bwd=32", "block_t_bwd=128 block_d_bwd=32",
             "block_d_bwd=32 num_warps_bwd=4", "block_t_bwd=256 block_d_bwd=8",
             "block_t_bwd=128 block_d_bwd=16 num_warps_bwd=4", "block_t_bwd=32 block_d_bwd=32",
             # session 12 candidates (docs/benchmarks/causal_conv1d.md): the SiLU backward's
             # shifted x tiles loaded once; the taps read from a [W, D] copy; both
             "bwd_window=1", "weight_tap_major=1", "bwd_window=1 weight_tap_major=1",
             "bwd_window=1 weight_tap_major=1 block_t_bwd=128 block_d_bwd=32 num_warps_bwd=8",
             "weight_tap_major=1 block_t_fwd=128", "weight_tap_major=1 reduce_block=256",
             # session 13 (no GPU): the SiLU backward's dpre once per row (persistent, scratch)
             "bwd_da_once=1", "bwd_da_once=1 weight_tap_major=1",
             # session 14: the forward in 32 / 16-row sub-tiles (plan fields since session
             # 15; the rule takes fwd_sub_t_linear = 32 and whole blocks with SiLU)
             "fwd_sub_t=32", "fwd_sub_t=16", "fwd_sub_t_linear=64", "fwd_sub_t_linear=16"],
    "gate": ["", "block_m_fwd=16", "block_m_fwd=64", "num_warps_fwd=4", "num_warps_fwd=16",
             "block_m_fwd=64 num_warps_fwd=16", "block_m_bwd=8", "block_m_bwd=32",
             "num_warps_bwd=2", "num_warps_bwd=8", "bwd_programs=528", "bwd_programs=132",
             "block_m_bwd=32 num_warps_bwd=8", "block_m_bwd=8 num_warps_bwd=2",
             # session 13 (no GPU): the backward loop pipelined (plan format 2); the rule
             # takes 3 at D <= 1024 since session 14 (1 = the earlier rule)
             "bwd_stages=1", "bwd_stages=2", "bwd_stages=4"],
}


def parse(s: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in s.split())}


#: Launcher knobs that are not plan fields (module attributes the launcher reads), named in a
#: configuration like a plan field: set for that configuration only.
KNOBS: dict[str, tuple[str, str]] = {}  # none at present (session 14's fwd_sub_t became a
# plan field of the conv family in session 15)


@contextlib.contextmanager
def knobs(over: dict):
    """Pops the KNOBS of ``over`` and sets them while the block runs."""
    import importlib
    old = []
    try:
        for k in [k for k in over if k in KNOBS]:
            mod = importlib.import_module(KNOBS[k][0])
            old.append((mod, KNOBS[k][1], getattr(mod, KNOBS[k][1])))
            setattr(mod, KNOBS[k][1], over.pop(k))
        yield over
    finally:
        for mod, name, val in reversed(old):
            setattr(mod, name, val)


def fam_rmsnorm(dev):
    from cake_rmsnorm_det_train import make_plan, rmsnorm_det
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    for T, H in ((32768, 4096), (16384, 8192), (65536, 2048)):
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        w = (1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(torch.bfloat16).requires_grad_()
        dy = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
        base = make_plan(H, torch.bfloat16, dev)

        def cake(plan, x=x, w=w):
            return (rmsnorm_det(x, w, 1e-6, plan=plan),)

        def anchor(x=x, w=w):
            return LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
        yield f"T={T} H={H}", base, cake, anchor, (x, w), dy


CONV_CASES = ""
CONV_ACT = "silu"


def fam_conv(dev):
    try:
        from fla.modules.convolution import causal_conv1d
    except ImportError:
        from fla.modules.causal_conv1d import causal_conv1d

    from cake_causal_conv1d_det_train import causal_conv1d_det, make_plan
    cases = (("a", 4, 4096, 4096, None), ("b", 1, 32768, 8192, 8))
    if CONV_CASES:  # --conv-cases "B,T,D,docs;..." (docs 0: fixed length)
        cases = tuple((f"x{i}", *(int(v) for v in c.split(",")[:3]), int(c.split(",")[3]) or None)
                      for i, c in enumerate(CONV_CASES.split(";")))
    for name, B, T, D, docs in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(B, T, D, generator=g).to(dev, torch.bfloat16).requires_grad_()
        w = (0.3 * torch.randn(D, 4, generator=g)).to(dev, torch.bfloat16).requires_grad_()
        dy = torch.randn(B, T, D, generator=g).to(dev, torch.bfloat16)
        cu = None
        if docs:
            cuts = torch.sort(torch.randperm(T - 1, generator=g)[: docs - 1] + 1).values
            cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(dev, torch.int32)
        base = make_plan(D, 4, torch.bfloat16, dev, varlen=cu is not None)
        act = None if CONV_ACT == "none" else CONV_ACT

        def cake(plan, x=x, w=w, cu=cu):
            return (causal_conv1d_det(x, w, activation=act, cu_seqlens=cu, plan=plan)[0],)

        def anchor(x=x, w=w, cu=cu):
            return causal_conv1d(x, w, None, activation=act, backend="triton",
                                 cu_seqlens=cu)[0]
        yield f"case {name} B={B} T={T} D={D} docs={docs}", base, cake, anchor, (x, w), dy


def fam_gate(dev):
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
    except ModuleNotFoundError:
        from fla.modules.fused_norm_gate import rms_norm_gated

    from cake_rmsnorm_silu_gate_det_train import make_plan, rmsnorm_silu_gate_det
    for N in (524288, 1048576):
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(N, 128, generator=g).to(dev, torch.bfloat16).requires_grad_()
        z = torch.randn(N, 128, generator=g).to(dev, torch.bfloat16).requires_grad_()
        w = (1 + 0.1 * torch.randn(128, generator=g)).to(dev, torch.bfloat16).requires_grad_()
        dy = torch.randn(N, 128, generator=g).to(dev, torch.bfloat16)
        base = make_plan(128, torch.bfloat16, dev)

        def cake(plan, x=x, z=z, w=w):
            return (rmsnorm_silu_gate_det(x, z, w, 1e-6, plan=plan),)

        def anchor(x=x, z=z, w=w):
            return rms_norm_gated(x, z, w, None, activation="silu", eps=1e-6)
        yield f"rows={N} D=128", base, cake, anchor, (x, z, w), dy


def run_fb(f, inputs, dy, keep=True):
    for t in inputs:
        t.grad = None
    y = f()
    y = y[0] if isinstance(y, tuple) else y
    y.backward(dy)
    if keep:
        return [y.detach().clone()] + [t.grad.clone() for t in inputs]
    return None


def device_ms(fn, iters=20):
    """Mean device time per call (ms): the sum of every GPU kernel's and copy's own time in a
    profile of ``iters`` calls (host time between launches excluded)."""
    from cake_core.bench import cuda_profile
    prof = cuda_profile(fn, warmup=1, iters=iters)
    return sum(e.self_device_time_total for e in prof.key_averages()) / iters / 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("family", choices=tuple(DEFAULTS))
    p.add_argument("configs", nargs="*")
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--reps", type=int, default=100, help="do_bench rep in ms")
    p.add_argument("--device-time", action="store_true",
                   help="also the device time per call (profiler kernel sums; no host time)")
    p.add_argument("--conv-cases", default="",
                   help='conv only: "B,T,D,docs;..." instead of cases a and b (docs 0: fixed)')
    p.add_argument("--conv-act", default="silu", choices=("silu", "none"),
                   help="conv only: the activation of both implementations")
    a = p.parse_intermixed_args()  # flags may come before the configs ("" = the rule)
    global CONV_CASES, CONV_ACT
    CONV_CASES, CONV_ACT = a.conv_cases, a.conv_act
    dev = torch.device("cuda")
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(),
          flush=True)
    configs = a.configs or DEFAULTS[a.family]
    for shape, base, cake, anchor, inputs, dy in globals()[f"fam_{a.family}"](dev):
        print(f"== {a.family} {shape}", flush=True)
        af = afb = adf = adfb = None
        if not a.compile_only:
            af = triton.testing.do_bench(anchor, warmup=25, rep=a.reps)
            afb = triton.testing.do_bench(lambda: run_fb(anchor, inputs, dy, False), warmup=25,
                                          rep=a.reps)
            print(f"   anchor fwd {af:.4f} ms  fwd+bwd {afb:.4f} ms", flush=True)
            if a.device_time:
                adf = device_ms(anchor)
                adfb = device_ms(lambda: run_fb(anchor, inputs, dy, False))
                print(f"   anchor device fwd {adf:.4f} ms  fwd+bwd {adfb:.4f} ms", flush=True)
        ref = run_fb(lambda: cake(base), inputs, dy)
        for c in configs:
            with knobs(parse(c)) as over:
                sweep_one(a, c, over, base, cake, inputs, dy, ref, af, afb, adf, adfb)


def sweep_one(a, c, over, base, cake, inputs, dy, ref, af, afb, adf, adfb):
    """One configuration: refused, or its bits, repeat, times and ratios printed."""
    try:
        plan = dataclasses.replace(base, **over)
        got = run_fb(lambda plan=plan: cake(plan), inputs, dy)
    except (ValueError, TypeError) as e:
        print(f"   [{c}] refused: {str(e)[:150]}", flush=True)
        return
    if a.compile_only:
        return
    again = run_fb(lambda plan=plan: cake(plan), inputs, dy)
    rep = all(torch.equal(u, v) for u, v in zip(got, again, strict=True))
    err = max(((u.float() - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-30))
              .item() for u, v in zip(got, ref, strict=True))
    f = triton.testing.do_bench(lambda plan=plan: cake(plan), warmup=25, rep=a.reps)
    fb = triton.testing.do_bench(lambda plan=plan: run_fb(lambda: cake(plan), inputs, dy, False),
                                 warmup=25, rep=a.reps)
    print(f"   [{c or 'rule'}] fwd {f:.4f} ({f / af:.3f}x)  fwd+bwd {fb:.4f} "
          f"({fb / afb:.3f}x)  diff-to-rule {err:.1e}  repeat {rep}", flush=True)
    if a.device_time:
        df = device_ms(lambda plan=plan: cake(plan))
        dfb = device_ms(lambda plan=plan: run_fb(lambda: cake(plan), inputs, dy, False))
        print(f"   [{c or 'rule'}] device fwd {df:.4f} ({df / adf:.3f}x)  fwd+bwd "
              f"{dfb:.4f} ({dfb / adfb:.3f}x)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
