"""The benchmark's smoke shape runs (det and nondet side by side) and records the ratio."""

import importlib.util
import json
import pathlib

from _lmhead_nd_cases import DEV

BENCH = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_lm_head_loss_nondet_train.py")


def test_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("_bench_lmhead_nondet", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "bench.json"
    assert mod.main(["--device", DEV.type, "--quick", "--warmup", "0", "--reps", "1",
                     "--check", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["shapes"]["64x32x1000"]
    assert "ratio_nondet_over_det" in rows["nondet"], rows
    assert max(rows["nondet"]["max_rel_diff_vs_det"]) < 1e-2
