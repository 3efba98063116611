"""Diagnosis: which outputs of cake's KDA forward + backward change between identical calls,
per plan, at a benchmark case (default a: B = 4, T = 4096, H = HV = 16, K = V = 128, bf16).

    python shared/gpu/kda_repeat_diag.py RUNS CASE "plan overrides" ["plan overrides" ...]
    (CASE: a benchmark case, or "B,T,H")
    e.g. python shared/gpu/kda_repeat_diag.py 10 a "" "bwd_split=1" "fwd_split=1 bwd_split=1"

Prints one line per plan: the number of distinct sha256 values of each output over RUNS calls
(1 everywhere = bitwise repeatable). Run two copies on one GPU at once to perturb timing.
"""
import importlib.util
import sys

import torch

path = "packages/cake-kda-det-train/benchmarks/bench_cake_kda_det_train.py"
spec = importlib.util.spec_from_file_location("kda_bench", path)
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
from cake_core import bench  # noqa: E402

runs, case = int(sys.argv[1]), sys.argv[2]
if not torch.cuda.is_available():
    b.DEV = "cpu"
if b.DEV == "cpu":
    c = b.make_case(1, 100, 1, None, K=32, V=32)
elif case in b.CASES:
    c = b.make_case(**b.CASES[case])
else:  # "B,T,H"
    B, T, H = (int(x) for x in case.split(","))
    c = b.make_case(B, T, H, None)
for spec_s in sys.argv[3:] or [""]:
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in spec_s.split()}
    fn = b.cake_fn(over)
    seen = [set() for _ in b.NAMES]
    try:
        for _ in range(runs):
            outs = b.grads_of(fn, c)
            for i, t in enumerate(outs):
                seen[i].add(bench.bits_sha256([t])[:16] if t is not None else "-")
        bad = {n: len(s) for n, s in zip(b.NAMES, seen, strict=True) if len(s) > 1}
        print(f"[{spec_s}] runs={runs} distinct: {bad or 'none (repeats)'}", flush=True)
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        print(f"[{spec_s}] failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
