"""The benchmark's smoke case runs (det and nondet side by side) and records the ratio."""

import importlib.util
import json
import pathlib

from _conv_nd_cases import DEV

BENCH = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_causal_conv1d_nondet_train.py")


def test_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("_bench_conv_nondet", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "bench.json"
    assert mod.main(["--device", DEV.type, "--cases", "tiny", "--warmup", "0", "--reps", "1",
                     "--check", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["cases"]["tiny"]["impls"]
    assert "fwdbwd_ratio_nondet_over_det" in rows["nondet"], rows
    assert max(rows["nondet"]["max_rel_diff_vs_det"]) < 1e-2
