"""Check plan configurations of the chunked linear-attention families (gdn, kda) on the GPU
against their float64 token recurrence, one subprocess per configuration (an illegal
access poisons only its own process).

    python shared/gpu/plan_configs.py gdn          # the family's built-in list, 8 at a time
    python shared/gpu/plan_configs.py kda "128 128 bfloat16 block_v=32" ...
    python shared/gpu/plan_configs.py kda one K V dtype key=val ...   (one configuration)
    ... lens=1,70,0,65 (document lengths; default 1,63,1,85)
    ... api.KB_WARPS=4 (a launch constant of the family's module ``api``, an int)
    CAKE_PLAN_CONFIGS_CPU=1 python ...   (the CUDA rule's plans under Triton's interpreter)

Prints, per configuration, the max relative error of o, final_state and every gradient,
or the failure (the launch that failed, with CUDA_LAUNCH_BLOCKING=1). Inputs: 4 packed
sequences of 1, 63, 1 and 85 tokens (lengths off the 64-token chunk), 2 value heads per
q/k head, an initial state; kda adds strong per-channel decays (down to -20 per token).
"""
import dataclasses
import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

#: "cuda", or "cpu" when CAKE_PLAN_CONFIGS_CPU=1 (Triton's interpreter runs the CUDA rule's
#: plans: tells a compiler fault on the GPU from a fault of the algorithm).
DEV = "cpu" if os.environ.get("CAKE_PLAN_CONFIGS_CPU") == "1" else "cuda"
if DEV == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

_COMMON = [
    "16 16 float32", "32 16 bfloat16", "32 32 float32", "64 64 float32", "64 128 float32",
    "128 128 bfloat16", "128 128 float16", "128 64 bfloat16", "100 48 bfloat16",
    "128 128 bfloat16 block_v=32", "128 128 bfloat16 num_warps_h=4",
    "128 128 bfloat16 fp32_dots=0", "128 128 bfloat16 store_16bit=0",
    "64 64 float32 fp32_dots=0", "128 128 bfloat16 num_stages_h=1",
]
#: fields KDA's plan has and GDN's no longer (GDN's prep runs 4 warps)
_KDA_ONLY = [
    "128 128 bfloat16 num_warps_prep=4", "128 128 bfloat16 num_warps_prep=8",
]
CONFIGS = {
    # block_v sets the output kernels' width, block_v_h the state kernels'; the
    # state-kernel configurations name both
    # (the CUDA rule at 16-bit K = V = 128 on Hopper: local_form 2 with one 128-column K
    # block of 8 warps; the two 64-column blocks of 4 warps are A100's and consumer GPUs')
    "gdn": _COMMON + ["128 128 bfloat16 block_k_local=64 num_warps_local=4",
                      "128 128 float16 block_k_local=64 num_warps_local=4",
                      "128 128 bfloat16 block_v=32 block_v_h=32",
                      # rec_form: the recurrences in FLA's operand form (the rule's at
                      # 16-bit K = 128; docs/benchmarks/gdn.md)
                      "128 128 bfloat16 rec_form=1", "128 128 float16 rec_form=1",
                      "128 128 bfloat16 rec_form=1 block_v=32 block_v_h=32",
                      "128 128 bfloat16 rec_form=1 num_warps_h=4",
                      "128 128 bfloat16 rec_form=1 block_v=32 block_v_h=32 num_warps_h=4",
                      "128 128 bfloat16 rec_form=1 num_stages_h=3",
                      "64 64 float32 rec_form=1",
                      "32 16 bfloat16 rec_form=1", "16 16 float32 rec_form=1",
                      "100 48 bfloat16 rec_form=1 lens=1,70,0,65",
                      "48 32 float32 rec_form=1 lens=1,70,0,65",
                      # local_form = 2: K-block programs (kernels/bwd_local_kblock.py)
                      "128 128 bfloat16 local_form=2", "128 128 float16 local_form=2",
                      "128 128 bfloat16 local_form=2 block_k_local=32 block_v_local=32 "
                      "num_warps_local=4",
                      "128 128 bfloat16 local_form=2 block_v_local=32",
                      "128 128 bfloat16 local_form=2 block_k_local=64 block_v_local=32 "
                      "num_warps_local=4",
                      "128 64 bfloat16 local_form=2", "64 64 float32 local_form=2",
                      "100 48 bfloat16 local_form=2 lens=1,70,0,65",
                      "48 32 float32 local_form=2 block_k_local=16 lens=1,70,0,65",
                      # the neighbours of the fenced fault (8 warps, block_k_local 16, fp32
                      # K = V = 40: an illegal access, 2026-12-03); right on an H200, 12-04
                      "40 40 float32 local_form=2 block_k_local=16 block_v_local=32 "
                      "num_warps_local=4 lens=1,70,0,65",
                      "40 40 float32 local_form=2 block_k_local=32 block_v_local=32 "
                      "lens=1,70,0,65",
                      "40 32 float32 local_form=2 block_k_local=16 num_warps_local=2 "
                      "lens=1,70,0,65",
                      # keep_states: the backward reads the forward's chunk states, w,
                      # v_new (built and tested on the CPU; not yet run on a GPU)
                      "128 128 bfloat16 keep_states=1",
                      "100 48 bfloat16 keep_states=1 lens=1,70,0,65",
                      "48 32 float32 keep_states=1 lens=1,70,0,65",
                      # block_v_h: the state kernels' V blocks apart from the
                      # output kernel's; session 14 (H200): right at K = 128, the 100 / 48
                      # entry faulted (now refused by cuda_plan_problem: expect a ValueError)
                      "128 128 bfloat16 block_v_h=32 num_warps_h=4",
                      "128 128 bfloat16 block_v_h=32",
                      "128 128 bfloat16 block_v_h=32 num_warps_h=4 keep_states=1",
                      "100 48 bfloat16 block_v_h=32 lens=1,70,0,65",
                      "128 128 float16 block_v_h=32 num_warps_h=4",
                      # the session-14 narrowed plans (state_programs) with 8 state warps;
                      # the rule's since session 24 add num_warps_h=4 (next lines)
                      "128 100 bfloat16 block_v_h=32 lens=1,70,0,65",
                      "128 64 float16 block_v_h=32",
                      "128 128 bfloat16 block_v_h=32 keep_states=1 lens=1,70,0,65",
                      "128 100 bfloat16 block_v_h=32 num_warps_h=4 lens=1,70,0,65",
                      "128 64 float16 block_v_h=32 num_warps_h=4"],
    "kda": _COMMON + _KDA_ONLY + [
                      # the token-parallel kernels' head blocks (HV = 2 here, so
                      # 4 and 8 overhang); not yet run on a GPU
                      "64 64 float32 tok_heads=1 tok_heads_bwd=8 num_warps_tok_bwd=2",
                      "128 128 bfloat16 tok_heads=8 num_warps_tok=4 tok_heads_bwd=2 "
                      "num_warps_tok_bwd=1",
                      # chunks cut inside each 16-row block
                      "64 64 bfloat16 lens=1,81,33,49", "128 128 bfloat16 lens=1,81,33,49",
                      "128 128 bfloat16 num_warps_bwd=4", "64 64 bfloat16 block_v_bwd=64",
                      "128 128 bfloat16 block_v_bwd=16", "32 32 bfloat16", "32 32 float16",
                      "32 64 float16", "32 128 bfloat16", "64 32 bfloat16", "128 32 float16",
                      "48 32 float32 lens=1,70,0,65", "100 100 bfloat16 lens=1,70,0,65",
                      # candidates for a faster rule (offline sm_90 builds: no spills)
                      "128 128 bfloat16 block_k_inner=16 block_v=32",
                      "128 128 float16 block_k_inner=16 block_v=32",
                      "64 64 bfloat16 block_k_inner=16 block_v=32",
                      "128 128 bfloat16 num_warps_o=4", "64 64 bfloat16", "128 128 float32",
                      "128 64 float32", "128 128 bfloat16 block_k_inner=32",
                      "128 128 bfloat16 block_k_inner=128", "64 64 float32 block_k_inner=16"],
}


def _family(name):
    """(entry, reference, make_plan, g shape suffix, g sampler) of a family."""
    import torch
    if name == "gdn":
        from cake_gdn_det_train import chunk_gated_delta_rule_det, gdn_reference, make_plan
        return (chunk_gated_delta_rule_det, gdn_reference, make_plan, lambda K: (),
                lambda x: torch.nn.functional.logsigmoid(x))
    from cake_kda_det_train import chunk_kda_det, kda_recurrence_ref, make_plan

    def kda_g(x):  # per-channel decays, a few channels at -20 per token
        g = torch.nn.functional.logsigmoid(x)
        g[..., :2] = -20.0
        return g
    return chunk_kda_det, kda_recurrence_ref, make_plan, lambda K: (K,), kda_g


def force_num_stages():
    """Diagnosis only: ``CAKE_DIAG_NS="kernel_name,..."`` launches those KDA/GDN kernels
    (named without the ``kda_``/``gdn_`` prefix and ``_kernel`` suffix, e.g. ``fwd_prep``)
    with ``num_stages=$CAKE_DIAG_NS_VALUE`` (default 1) where the launcher gives none."""
    names = [n for n in os.environ.get("CAKE_DIAG_NS", "").split(",") if n]
    value = int(os.environ.get("CAKE_DIAG_NS_VALUE", "1"))
    import importlib
    for fam in ("kda", "gdn"):
        for mod in ("chunk_fwd", "chunk_bwd"):
            try:
                m = importlib.import_module(f"cake_{fam}_det_train.kernels.{mod}")
            except ImportError:
                continue
            for n in names:
                kern = getattr(m, f"{fam}_{n}_kernel", None)
                if kern is None:
                    continue
                orig = kern.run

                def run(*a, _orig=orig, **k):
                    k.setdefault("num_stages", value)
                    return _orig(*a, **k)
                kern.run = run


def one(fam, K, V, dtype, *over):
    import torch
    force_num_stages()
    entry, reference, make_plan, gdim, gsample = _family(fam)
    dt = getattr(torch, dtype)
    plan = make_plan(K, V, dt, "cuda")  # the CUDA rule's plan, also under the interpreter
    kw = dict(kv.split("=") for kv in over)
    lens = [int(n) for n in kw.pop("lens", "1,63,1,85").split(",")]  # document lengths
    import importlib
    for name in [n for n in kw if "." in n]:  # module.NAME=int: a launch constant
        mod, attr = name.rsplit(".", 1)
        setattr(importlib.import_module(f"cake_{fam}_det_train.{mod}"), attr, int(kw.pop(name)))
    plan = dataclasses.replace(plan, **{n: int(x) for n, x in kw.items()})
    gen = torch.Generator().manual_seed(0)
    B, T, H, HV = 1, sum(lens), 1, 2
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEV)
    rn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(DEV)  # noqa: E731
    x = {"q": rn(B, T, H, K), "k": torch.nn.functional.normalize(rn(B, T, H, K), dim=-1),
         "v": rn(B, T, HV, V), "g": gsample(rn(B, T, HV, *gdim(K))),
         "beta": torch.sigmoid(rn(B, T, HV)), "h0": 0.3 * rn(len(lens), HV, K, V)}
    do, dht = rn(B, T, HV, V), rn(len(lens), HV, K, V)
    lo = {n: (t.to(dt) if n in "qkv" else t.float()).requires_grad_() for n, t in x.items()}
    hi = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, ht = entry(lo["q"], lo["k"], lo["v"], lo["g"], lo["beta"], initial_state=lo["h0"],
                  output_final_state=True, cu_seqlens=cu, plan=plan)
    torch.autograd.backward([o, ht], [do.to(dt), dht.float()])
    if DEV == "cuda":
        torch.cuda.synchronize()
    o2, ht2 = reference(hi["q"], hi["k"], hi["v"], hi["g"], hi["beta"], initial_state=hi["h0"],
                        output_final_state=True, cu_seqlens=cu, dtype=torch.float64)
    torch.autograd.backward([o2, ht2], [do, dht])
    errs = {}
    for n, a, r in [("o", o, o2), ("ht", ht, ht2)] + [("d" + n, lo[n].grad, hi[n].grad)
                                                     for n in x]:
        errs[n] = float((a.double() - r).abs().max() / r.abs().max())
    print("ERRS", " ".join(f"{n}={e:.1e}" for n, e in errs.items()))


def run(fam, cfg):
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    p = subprocess.run([sys.executable, __file__, fam, "one", *cfg.split()],
                       capture_output=True, text=True, env=env, timeout=240)
    out = [ln for ln in p.stdout.splitlines() if ln.startswith("ERRS")]
    if out:
        return f"{fam} {cfg:45s} {out[-1][5:]}"
    tb = [ln for ln in p.stderr.splitlines() if "kernel[" in ln or "Error" in ln]
    return f"{fam} {cfg:45s} FAILED rc={p.returncode} {' | '.join(tb[-3:])[:400]}"


if __name__ == "__main__":
    fam = sys.argv[1] if len(sys.argv) > 1 else "gdn"
    if fam not in CONFIGS:
        sys.exit(f"family must be one of {sorted(CONFIGS)}, got {fam!r}")
    if len(sys.argv) > 2 and sys.argv[2] == "one":
        a = sys.argv[3:]
        one(fam, int(a[0]), int(a[1]), a[2], *a[3:])
    else:
        cfgs = sys.argv[2:] or CONFIGS[fam]
        with ThreadPoolExecutor(8) as ex:
            for line in ex.map(lambda c: run(fam, c), cfgs):
                print(line, flush=True)
