"""The benchmark's CPU smoke run: a tiny Qwen3-Next, two cake runs and one unpatched, each in
its own process; the cake runs repeat bitwise and stay close to the unpatched one."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_cake_transformers.py")


def test_bench_tiny_cpu(tmp_path):
    import pytest
    from cake_core.backend import interpreter_numpy_problem

    problem = interpreter_numpy_problem()
    if problem is not None:  # a GPU image may carry a numpy the interpreter cannot run with
        pytest.skip(problem)
    out = tmp_path / "r.json"
    # a CPU run on any machine: the kernels through Triton's interpreter
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
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


def test_bench_graph_runs_need_cuda(tmp_path):
    """A ``-graph`` run is refused up front on a machine without CUDA (argparse's error)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, BENCH, "--size", "tiny", "--steps", "1", "--seq", "16",
                        "--runs", "cake,cake-graph"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2 and "cake-graph: a CUDA graph needs a CUDA device" in r.stderr


def test_bench_whole_step_cuda_graph(tmp_path):
    """CUDA: the tiny model's whole training step captured and replayed (``cake-graph``):
    two graph runs bitwise identical, the first loss equal to the eager run's (same weights,
    same kernels), the later ones close (the optimizer's capturable form rounds otherwise)."""
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a CUDA device")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, BENCH, "--size", "tiny", "--steps", "4", "--warmup", "1",
                        "--seq", "256", "--runs", "cake,cake-graph,cake-graph", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cake-graph: 2 runs, losses and final weights bitwise identical: True" in r.stdout, \
        r.stdout[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [x["impl"] for x in runs] == ["cake", "cake-graph", "cake-graph"], r.stdout[-3000:]
    eager, graph = runs[0]["losses"], runs[1]["losses"]
    assert abs(eager[0] - graph[0]) < 1e-6
    for a, b in zip(eager, graph, strict=True):
        assert abs(a - b) < 5e-2
