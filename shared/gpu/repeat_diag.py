"""Diagnosis: which outputs of cake's KDA or GDN forward + backward change between
identical calls, per plan, at one of the family benchmark's cases (bf16, K = V = 128).

    python shared/gpu/repeat_diag.py FAMILY RUNS CASE ["plan overrides" ...] [--burn N] [--trace]
    e.g. python shared/gpu/repeat_diag.py kda 20 a "" "num_warps_bwd=4" --burn 2
    (FAMILY: kda or gdn; CASE: a benchmark case, or "B,T,H"; "" = the rule's plan)
    --no-wgmma: dots built without Hopper's wgmma (tells a wgmma-path fault from others)

Prints one line per plan: the number of distinct sha256 values of each output over RUNS calls
(none = bitwise repeatable). ``--burn N`` starts N other processes that multiply bf16
matrices on the same GPU meanwhile, so that the GPU time-slices between processes: on an
H200 with Triton 3.6 (2026-11-30) that made dk, dg and dbeta differ between calls for every
plan tried, while the same runs on an otherwise idle GPU repeated.
"""
import argparse
import importlib.util
import os
import sys
import tempfile

if "--no-wgmma" in sys.argv:  # before Triton compiles anything; a fresh cache (the switch
    # is read by the compiler, and may not be part of Triton's cache key)
    os.environ["DISABLE_MMA_V3"] = "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-no-wgmma-")

import cake_core.triton_utils  # noqa: F401  (first: on a CPU it picks Triton's interpreter)
import torch

FAM = sys.argv[1] if len(sys.argv) > 1 else "kda"
path = f"packages/cake-{FAM}-det-train/benchmarks/bench_cake_{FAM}_det_train.py"
spec = importlib.util.spec_from_file_location(f"{FAM}_bench", path)
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
from cake_core import bench, testing  # noqa: E402

sys.path.insert(0, "shared/gpu")
import launch_trace  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("family", choices=("kda", "gdn"))
p.add_argument("runs", type=int)
p.add_argument("case")
p.add_argument("plans", nargs="*")
p.add_argument("--burn", type=int, default=0)
p.add_argument("--no-wgmma", action="store_true",
               help="Triton builds dots without Hopper's asynchronous wgmma (DISABLE_MMA_V3=1)")
p.add_argument("--trace", action="store_true",
               help="also name the first Triton launch whose results differ (launch_trace.py)")
a = p.parse_args()
cuda = torch.cuda.is_available()
if FAM == "kda":
    if not cuda:
        b.DEV = "cpu"
    make = b.make_case
    tiny = dict(B=1, T=100, H=1, docs=None, K=32, V=32)
else:
    def make(**kw):
        kw.setdefault("HV", kw["H"])
        return b.make_case(dev="cuda" if cuda else "cpu", **kw)
    tiny = dict(B=1, T=100, H=1, HV=2, docs=None, K=32, V=32)
if not cuda:
    c = make(**tiny)
elif a.case in b.CASES:
    c = make(**b.CASES[a.case])
else:  # "B,T,H"
    B, T, H = (int(x) for x in a.case.split(","))
    c = make(B=B, T=T, H=H, docs=None)
with testing.gpu_time_sharers(a.burn if cuda else 0):
    for spec_s in a.plans or [""]:
        over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in spec_s.split()}
        fn = b.cake_fn(over)
        seen = [set() for _ in b.NAMES]
        try:
            logs = {}
            for _ in range(a.runs):
                if a.trace:
                    with launch_trace.trace(f"cake_{FAM}_det_train") as log:
                        outs = b.grads_of(fn, c)
                else:
                    outs, log = b.grads_of(fn, c), None
                key = tuple(bench.bits_sha256([t])[:16] if t is not None else "-" for t in outs)
                logs.setdefault(key, log)
                for i, h in enumerate(key):
                    seen[i].add(h)
            bad = {n: len(s) for n, s in zip(b.NAMES, seen, strict=True) if len(s) > 1}
            tag = f"runs={a.runs} burn={a.burn}" + (" no-wgmma" if a.no_wgmma else "")
            print(f"[{spec_s}] {tag} distinct: {bad or 'none (repeats)'}", flush=True)
            if a.trace and len(logs) > 1:
                first, second = list(logs.values())[:2]
                print(f"[{spec_s}] first differing launch: "
                      f"{launch_trace.first_difference(first, second)}", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, not fatal
            print(f"[{spec_s}] failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
