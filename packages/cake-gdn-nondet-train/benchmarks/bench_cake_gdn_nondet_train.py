"""Benchmark cake-gdn-nondet-train side by side with cake-gdn-det-train (and FLA's
``chunk_gated_delta_rule`` when installed): the ratio issue 44 asks for, nondet / det.

    python benchmarks/bench_cake_gdn_nondet_train.py [--impls nondet,det,fla]
        [--cases a,b,c,d] [--reps N] [--hash] [--out f.json]

The cases, inputs and timing are cake-gdn-det-train's benchmark
(``packages/cake-gdn-det-train/benchmarks/bench_cake_gdn_det_train.py``, loaded from this
repository): bf16 q/k/v, K = V = 128; ``a`` 32768 tokens, H = 16, HV = 32; ``b`` 8 even
documents, HV = H = 16; ``c`` 8 random documents, HV = 32; ``d`` B = 4, T = 4096, H = HV = 16.
Per case and implementation: forward, backward and forward+backward (median of CUDA-event
times over ``--reps`` runs after warm-up) and the first call. ``ratio`` is nondet / det (below
1: nondet faster; today the two run the same kernels, so about 1). ``--hash``: sha256 of o,
final_state and every gradient over 5 runs (nondet's bits are not promised: the hashes say
whether they repeat). Needs CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from cake_core import bench

_DET = (Path(__file__).resolve().parents[2] / "cake-gdn-det-train" / "benchmarks"
        / "bench_cake_gdn_det_train.py")


def _det_bench():
    spec = importlib.util.spec_from_file_location("bench_cake_gdn_det_train", _DET)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nondet_fn():
    from cake_gdn_nondet_train import chunk_gated_delta_rule_nondet, make_nondet_plan

    plans = {}  # one plan object per key, as the det benchmark's cake_fn

    def run(q, k, v, g, beta, h0, cu):
        n = q.shape[0] if cu is None else cu.numel() - 1
        key = (q.shape[-1], v.shape[-1], q.dtype, q.device, n * v.shape[2])
        if key not in plans:
            plans[key] = make_nondet_plan(*key[:4], state_programs=key[4])
        return chunk_gated_delta_rule_nondet(q, k, v, g, beta, initial_state=h0,
                                             output_final_state=True, cu_seqlens=cu,
                                             plan=plans[key])
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impls", default="nondet,det,fla")
    p.add_argument("--cases", default="a,b,c,d")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--hash", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args()
    db = _det_bench()
    make = {"nondet": nondet_fn, "det": lambda: db.cake_fn({}), "fla": lambda: db.fla_fn(True)}
    impls = bench.load_impls(a.impls.split(","), lambda name: make[name]())
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(), flush=True)
    result = {"cases": bench.compare_cases(
        [s for s in a.cases.split(",") if s], lambda name: db.make_case(**db.CASES[name]),
        impls, time_impl=lambda fn, c: db.time_impl(fn, c, a.reps),
        hashes=db.hashes if a.hash else None, baseline="nondet", anchor="det")}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
