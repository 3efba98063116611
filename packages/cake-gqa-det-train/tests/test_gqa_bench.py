"""The benchmark's smoke mode runs and writes its records (on the CPU, or on CUDA where
cake's kernels compile for it)."""
import json
import pathlib
import subprocess
import sys

import torch

BENCH = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_gqa_det_train.py")


def test_bench_quick_cpu(tmp_path):
    out = tmp_path / "b.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    done = subprocess.run([sys.executable, str(BENCH), "--device", device, "--quick",
                           "--impls", "cake_det,sdpa_math", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads(out.read_text())["records"][0]
    assert rec["impls"]["cake_det"]["bitwise_repeat"] is True
    assert rec["impls"]["sdpa_math"]["fwd_bwd"]["ms"] > 0
