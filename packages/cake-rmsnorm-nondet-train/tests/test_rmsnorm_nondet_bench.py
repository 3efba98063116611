"""The benchmark's smoke mode runs and writes its records (on the CPU, or on CUDA)."""
import json
import pathlib
import subprocess
import sys

import torch

BENCH = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_rmsnorm_nondet_train.py")


def test_bench_quick(tmp_path):
    out = tmp_path / "b.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    done = subprocess.run([sys.executable, str(BENCH), "--device", device, "--quick",
                           "--shapes", "64x128", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rec = json.loads(out.read_text())["records"][0]
    assert rec["same_bits_as_det"] is True  # the det kernels and plans today
    assert rec["fwdbwd"]["det_ms"] > 0 and rec["fwdbwd"]["nondet_ms"] > 0
