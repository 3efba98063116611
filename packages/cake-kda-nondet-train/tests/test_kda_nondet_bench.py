"""The benchmark script loads (with cake-kda-det-train's cases and timing) and its nondet
implementation runs a tiny case on the test device."""

import importlib.util
from pathlib import Path

import torch
from _kda_nd_cases import DEV

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cake_kda_nondet_train.py"


def test_benchmark_runs_a_tiny_case():
    spec = importlib.util.spec_from_file_location("bench_cake_kda_nondet_train", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    db = mod._det_bench()
    assert set(db.CASES) == {"a", "b", "c"}
    c = db.make_case(B=1, T=20, H=1, docs=None, K=16, V=16, dtype=torch.float32, dev=DEV,
                     in_kernel=True)
    got = db.grads_of(mod.nondet_fn(db), c)
    want = db.grads_of(db.cake_fn({}), c)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
