"""Before / after check of a change to the chunk engine (the state recurrence, output stage
or chunk-local prep that GDN and KDA share): the bits of o, final_state and every gradient
per case, and on CUDA the fwd+bwd time beside FLA.

    python3 shared/gpu/chunk_engine_check.py REPO [--save FILE] [--compare FILE]
        [--only gdn|kda] [--cases SUBSTRING] [--no-time] [--reps N]

REPO is the one variable: a checkout of cake (its ``packages/*/src`` go first on
``sys.path``), e.g. a worktree at the commit before the change and one after. Run it once
per checkout in separate processes; ``--save`` writes the outputs (``torch.save``) and
``--compare`` checks them against a saved file with ``torch.equal`` on the raw bits
(exit 1 on any difference). Each output prints as ``family/case name sha256``.

Cases: packed documents with an empty and a length-1 one and lengths off 64 (and a
fixed-length batch), GVA (HV = 2H), K and V off the block sizes, fp32 and bf16, an initial
state and a final-state gradient; under the rule's plan of the device, plus explicit plans
for the forms the CUDA rule picks (GDN ``rec_form = 1`` / ``local_form = 2``; the CUDA
rule's plans at K = V = 128 bf16), so the interpreter covers them too. Under the
interpreter (no CUDA) the cases stay small (minutes on two cores).

On CUDA also: per benchmark case of each family (bf16, K = V = 128, the families'
benchmarks/bench_cake_*.py ``make_case``), the sha256 of every output and the fwd+bwd
median of ``triton.testing.do_bench`` (ms) for cake and, where ``import fla`` works, FLA on
the same inputs, with the ratio cake / FLA.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import importlib.util
import os
import sys


def _paths(repo: str) -> str:
    repo = os.path.abspath(repo)
    if os.path.basename(repo) == "packages":
        repo = os.path.dirname(repo)
    srcs = sorted(glob.glob(os.path.join(repo, "packages", "*", "src")))
    if not srcs:
        raise SystemExit(f"{repo}: no packages/*/src here")
    sys.path[:0] = srcs
    return repo


def _bits(t):
    from cake_core.testing import bits
    return bits(t).cpu()


def _sha(t) -> str:
    if t is None:
        return "None"
    return hashlib.sha256(_bits(t).numpy().tobytes()).hexdigest()


def _cu(lens, dev):
    import torch
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=dev)


def _inputs(fam, B, T, H, HV, K, V, dtype, dev, n_states, seed=0):
    import torch
    import torch.nn.functional as F
    from cake_core.testing import randn
    q = randn((B, T, H, K), torch.float64, seed=seed)
    k = F.normalize(randn((B, T, H, K), torch.float64, seed=seed + 1), dim=-1)
    v = randn((B, T, HV, V), torch.float64, seed=seed + 2)
    gshape = (B, T, HV) if fam == "gdn" else (B, T, HV, K)
    g = F.logsigmoid(randn(gshape, torch.float64, seed=seed + 3))
    beta = torch.sigmoid(randn((B, T, HV), torch.float64, seed=seed + 4))
    h0 = 0.5 * randn((n_states, HV, K, V), torch.float64, seed=seed + 5)
    do = randn((B, T, HV, V), torch.float64, seed=seed + 6)
    dht = 0.5 * randn((n_states, HV, K, V), torch.float64, seed=seed + 7)
    q, k, v, do = (t.to(dev, dtype) for t in (q, k, v, do))
    g, beta, h0, dht = (t.to(dev, torch.float32) for t in (g, beta, h0, dht))
    return (q, k, v, g, beta), h0, do, dht


def _family(fam):
    if fam == "gdn":
        from cake_gdn_det_train import chunk_gated_delta_rule_det as entry
        from cake_gdn_det_train import make_plan
    else:
        from cake_kda_det_train import chunk_kda_det as entry
        from cake_kda_det_train import make_plan
    return entry, make_plan


NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0")


def _run(entry, plan, inputs, h0, do, dht, cu, l2):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    s = h0.detach().clone().requires_grad_()
    o, ht = entry(*leaves, initial_state=s, output_final_state=True,
                  use_qk_l2norm_in_kernel=l2, cu_seqlens=cu, plan=plan)
    import torch
    torch.autograd.backward([o, ht], [do, dht])
    return [o, ht] + [t.grad for t in leaves] + [s.grad]


#: (name, K, V, dtype name, plan device ("" = the run's device), plan overrides, packed)
CASES = {
    "gdn": [
        ("fp32-K32-V48", 32, 48, "float32", "", {}, True),
        ("fp32-K40-V24-fixed", 40, 24, "float32", "", {}, False),
        ("bf16-K64-V64", 64, 64, "bfloat16", "", {}, True),
        ("fp32-K48-V40-form1", 48, 40, "float32", "", dict(block_v=32, rec_form=1), True),
        ("bf16-K32-V64-form1", 32, 64, "bfloat16", "",
         dict(block_v=32, num_stages_h=2, rec_form=1), True),
        ("fp32-K48-V40-bvh32", 48, 40, "float32", "", dict(block_v_h=32), True),
        ("bf16-K128-V128-cudarule", 128, 128, "bfloat16", "cuda", {}, True),
        ("bf16-K64-V48-cudarule", 64, 48, "bfloat16", "cuda", {}, True),
    ],
    "kda": [
        ("fp32-K32-V48", 32, 48, "float32", "", {}, True),
        ("fp32-K40-V24-fixed", 40, 24, "float32", "", {}, False),
        ("bf16-K64-V64", 64, 64, "bfloat16", "", {}, True),
        ("fp32-K48-V40-bvh32", 48, 40, "float32", "", dict(block_v_h=32), True),
        ("bf16-K128-V128-cudarule", 128, 128, "bfloat16", "cuda", {}, True),
        ("bf16-K64-V48-cudarule", 64, 48, "bfloat16", "cuda", {}, True),
    ],
}
LENS = [1, 70, 0, 65, 130]


def hash_cases(fams, dev, out: dict, pick: str = ""):
    import torch
    for fam in fams:
        entry, make_plan = _family(fam)
        for name, K, V, dt, pdev, over, packed in CASES[fam]:
            if pick and pick not in name:
                continue
            dtype = getattr(torch, dt)
            plan = make_plan(K, V, dtype, pdev or dev)
            if over:
                plan = dataclasses.replace(plan, **over)
            if packed:
                B, T, cu, n = 1, sum(LENS), _cu(LENS, dev), len(LENS)
            else:
                B, T, cu, n = 2, 70, None, 2
            inputs, h0, do, dht = _inputs(fam, B, T, 1, 2, K, V, dtype, dev, n)
            try:
                res = _run(entry, plan, inputs, h0, do, dht, cu, l2=name.endswith("fixed"))
            except ValueError as e:  # a plan this device refuses (cuda_plan_problem)
                print(f"{fam}/{name} refused: {e}", flush=True)
                continue
            for nm, t in zip(NAMES, res, strict=True):
                key = f"{fam}/{name} {nm}"
                out[key] = None if t is None else t.detach().cpu()
                print(f"{key} {_sha(t)}", flush=True)


def bench_cases(repo, fams, reps, out: dict):
    import torch
    import triton.testing
    try:
        import fla  # noqa: F401
        have_fla = True
    except ImportError:
        have_fla = False
        print("fla: not importable, cake only", flush=True)
    for fam in fams:
        path = os.path.join(repo, f"packages/cake-{fam}-det-train/benchmarks/"
                            f"bench_cake_{fam}_det_train.py")
        spec = importlib.util.spec_from_file_location(f"bench_{fam}", path)
        b = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(b)
        impls = {"cake": b.cake_fn({})}
        if have_fla:  # GDN's takes the flag lifting FLA's Hopper backward guard
            impls["fla"] = b.fla_fn(True) if fam == "gdn" else b.fla_fn()
        # the benchmarks' call forms: GDN's step(fn, c, x), KDA's fn(c, x)
        call = b.step if fam == "gdn" else (lambda fn, c, x: fn(c, x))
        for case in b.CASES:
            c = b.make_case(**b.CASES[case])
            ms = {}
            for impl, fn in impls.items():
                grads = b.grads_of(fn, c)
                if impl == "cake":  # large: kept as hashes
                    for nm, t in zip(b.NAMES, grads, strict=True):
                        key = f"{fam}/bench-{case} {nm}"
                        out[key] = _sha(t)
                        print(f"{key} {out[key]}", flush=True)
                del grads
                x = b.leaves(c)

                def fwd_bwd(fn=fn, x=x):
                    for t in x.values():
                        if t is not None:
                            t.grad = None
                    outs = call(fn, c, x)
                    torch.autograd.backward(list(outs), [c["do"], c["dht"]])
                ms[impl] = triton.testing.do_bench(fwd_bwd, warmup=25, rep=reps)
            ratio = f"  cake/fla {ms['cake'] / ms['fla']:.3f}" if "fla" in ms else ""
            print(f"{fam}/bench-{case} fwd+bwd ms: " +
                  "  ".join(f"{k} {v:.3f}" for k, v in ms.items()) + ratio, flush=True)
            del c
            torch.cuda.empty_cache()


def compare(out: dict, path: str, subset: bool) -> bool:
    """Whether every output of ``out`` has the bits of the one in ``path`` (the benchmark
    cases' by their sha256; outputs of only one side: differences, except the CUDA-only
    benchmark cases and, with ``subset`` (a run of some cases), the saved outputs of the
    others)."""
    import torch
    ref = torch.load(path)
    ok = True
    for key in sorted(set(out) if subset else set(ref) | set(out)):
        if key not in ref or key not in out:
            if "/bench-" not in key:
                print(f"DIFF {key}: only in {'the saved file' if key in ref else 'this run'}")
                ok = False
            continue
        a, b = ref[key], out[key]
        if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
            same = a == b if isinstance(a, str) or isinstance(b, str) else a is b
        else:
            same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
        if not same:
            print(f"DIFF {key}")
            ok = False
    print("compare:", "all bits equal" if ok else "DIFFERENT", f"({len(out)} outputs)")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("repo")
    p.add_argument("--save")
    p.add_argument("--compare")
    p.add_argument("--only", choices=("gdn", "kda"))
    p.add_argument("--cases", default="", help="only the hash cases whose name contains this")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--reps", type=int, default=200, help="do_bench rep (ms of timing)")
    a = p.parse_args()
    repo = _paths(a.repo)
    import cake_core.triton_utils  # noqa: F401  (first: on a CPU it picks the interpreter)
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    fams = [a.only] if a.only else ["gdn", "kda"]
    out: dict = {}
    hash_cases(fams, dev, out, a.cases)
    if dev == "cuda" and not a.no_time:
        bench_cases(repo, fams, a.reps, out)
    if a.save:
        torch.save(out, a.save)
    if a.compare and not compare(out, a.compare, bool(a.only or a.cases)):
        sys.exit(1)


if __name__ == "__main__":
    main()
