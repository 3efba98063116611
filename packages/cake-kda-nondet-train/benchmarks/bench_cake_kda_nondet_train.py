"""Benchmark cake-kda-nondet-train side by side with cake-kda-det-train (and FLA's
``chunk_kda`` when installed): the ratio issue 44 asks for, nondet / det.

    python benchmarks/bench_cake_kda_nondet_train.py [--impls nondet,det,fla] [--cases a,b,c]
        [--in-kernel] [--reps N] [--hash] [--out f.json]

The cases, inputs and timing are cake-kda-det-train's benchmark
(``packages/cake-kda-det-train/benchmarks/bench_cake_kda_det_train.py``, loaded from this
repository): bf16 q/k/v, K = V = 128, HV = H; ``a`` B=4, T=4096, H=16; ``b`` B=2, T=8192,
H=32; ``c`` 32768 tokens packed as 8 documents, H=32; ``--in-kernel`` runs Kimi Linear's
call (in-kernel L2 norm, gate and beta sigmoid). Per case and implementation: forward,
backward and forward+backward (median of CUDA-event times over ``--reps`` runs after
warm-up) and the first call. ``ratio`` is nondet / det (below 1: nondet faster; today the
two run the same kernels, so about 1). ``--hash``: sha256 of o, final_state and every
gradient over 5 runs (nondet's bits are not promised: the hashes say whether they repeat).
Needs CUDA.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from cake_core import bench

_DET = (Path(__file__).resolve().parents[2] / "cake-kda-det-train" / "benchmarks"
        / "bench_cake_kda_det_train.py")


def _det_bench():
    spec = importlib.util.spec_from_file_location("bench_cake_kda_det_train", _DET)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nondet_fn(det_bench):
    from cake_kda_nondet_train import chunk_kda_nondet, make_nondet_plan

    def run(c, x):
        q = x["q"]
        plan = make_nondet_plan(q.shape[-1], x["v"].shape[-1], q.dtype, q.device)
        return chunk_kda_nondet(q, x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                output_final_state=True, cu_seqlens=c["cu"], plan=plan,
                                **det_bench._opts(c, x))
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--impls", default="nondet,det,fla")
    p.add_argument("--cases", default="a,b,c")
    p.add_argument("--in-kernel", action="store_true",
                   help="in-kernel L2 norm, gate (A_log, dt_bias) and beta sigmoid")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--hash", action="store_true")
    p.add_argument("--out", default="")
    a = p.parse_args()
    db = _det_bench()
    make = {"nondet": lambda: nondet_fn(db), "det": lambda: db.cake_fn({}), "fla": db.fla_fn}
    impls = bench.load_impls(a.impls.split(","), lambda name: make[name]())
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(), "in-kernel",
          a.in_kernel, flush=True)
    result = {"in_kernel": a.in_kernel, "cases": bench.compare_cases(
        [s for s in a.cases.split(",") if s],
        lambda name: db.make_case(**db.CASES[name], in_kernel=a.in_kernel), impls,
        time_impl=lambda fn, c: db.time_impl(fn, c, a.reps),
        hashes=db.hashes if a.hash else None, baseline="nondet", anchor="det")}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
