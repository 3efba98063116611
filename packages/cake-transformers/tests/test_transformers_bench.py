"""The benchmark's CPU smoke run: a tiny Qwen3-Next, two cake runs and one unpatched, each in
its own process; the cake runs repeat bitwise and stay close to the unpatched one."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_cake_transformers.py")


def test_bench_tiny_cpu(tmp_path):
    out = tmp_path / "r.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, BENCH, "--size", "tiny", "--steps", "2", "--warmup", "1",
                        "--seq", "16", "--runs", "cake,cake,hf", "--out", str(out),
                        "--profile", "1"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cake: 2 runs, losses and final weights bitwise identical: True" in r.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [x["impl"] for x in runs] == ["cake", "cake", "hf"]
    assert "Self CPU" in runs[0]["profile"]  # --profile: the profiler's table
    # fp32 on a CPU: the cake kernels and transformers' torch code agree to float rounding
    for a, b in zip(runs[0]["losses"], runs[2]["losses"], strict=True):
        assert abs(a - b) < 1e-4
