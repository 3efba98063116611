"""The benchmark (nondet against det, a training step each) runs its tiny CPU case."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = (Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_mhc_nondet_train.py")
_spec = importlib.util.spec_from_file_location("bench_mhc_nondet", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="--device cpu needs Triton's interpreter, which a CUDA machine's "
                    "test run does not enable")
def test_cpu_smoke(tmp_path):
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--quick", "--dtype", "fp32", "--warmup", "0",
                       "--rep", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert res and all(r["same_bits"] and r["ratio"] > 0 for r in res)
