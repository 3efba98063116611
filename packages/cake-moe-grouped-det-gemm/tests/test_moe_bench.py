"""The benchmark imports, builds its routings, and runs one tiny case on the CPU."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cake_moe_grouped_det_gemm.py"
_spec = importlib.util.spec_from_file_location("bench_moe", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_group_sizes():
    for E in (1, 8, 64, 128):
        for routing in bench.ROUTINGS:
            sizes = bench.group_sizes(16384 * 8, E, routing)
            assert len(sizes) == E and sum(sizes) == 16384 * 8 and min(sizes) >= 0
    skew = bench.group_sizes(16384 * 8, 64, "skewed")
    assert skew.count(0) == 16 and max(skew) > 4 * (16384 * 8 // 64)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="--device cpu needs Triton's interpreter, which a CUDA machine's "
                    "test run does not enable")
def test_cpu_smoke(tmp_path):
    out = tmp_path / "moe.json"
    rc = bench.main(["--device", "cpu", "--quick", "--experts", "3", "--nk", "16x24",
                     "--tokens", "8", "--top-k", "2", "--loop-anchor", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    assert len(res) == 2 and all(r["wgrad_bitwise_repeat"] for r in res)
    assert all(max(r["rel_err"].values()) < 1e-2 for r in res)
    assert all("ms" in r["phases"][ph]["cake"] for r in res for ph in bench.PHASES)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="--device cpu needs Triton's interpreter (see test_cpu_smoke)")
def test_cpu_smoke_tma_plan(tmp_path):
    """``--plan tma=1`` runs the TMA kernels and the JSON records the plan run."""
    out = tmp_path / "moe_tma.json"
    rc = bench.main(["--device", "cpu", "--quick", "--experts", "3", "--nk", "16x24",
                     "--tokens", "8", "--top-k", "2", "--routings", "skewed", "--plan",
                     "tma=1", "--out", str(out)])
    assert rc == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["plan"]["tma"] == 1 and r["wgrad_bitwise_repeat"]
    assert max(r["rel_err"].values()) < 1e-2


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="--device cpu needs Triton's interpreter (see test_cpu_smoke)")
def test_cpu_smoke_grouped_mm_plan(tmp_path):
    """``--plan grouped_mm_fwd_dgrad=1``: fwd and dgrad on torch._grouped_mm (its CPU
    fallback), the wgrad on cake's kernels; the JSON records the plan run."""
    out = tmp_path / "moe_gmm.json"
    rc = bench.main(["--device", "cpu", "--quick", "--experts", "3", "--nk", "16x24",
                     "--tokens", "8", "--top-k", "2", "--routings", "skewed", "--plan",
                     "grouped_mm_fwd_dgrad=1", "--out", str(out)])
    assert rc == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["plan"]["grouped_mm_fwd_dgrad"] == 1 and r["wgrad_bitwise_repeat"]
    assert max(r["rel_err"].values()) < 1e-2


LAYER = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_moe_layer.py"
_lspec = importlib.util.spec_from_file_location("bench_moe_layer", LAYER)
layer_bench = importlib.util.module_from_spec(_lspec)
_lspec.loader.exec_module(layer_bench)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="--device cpu needs Triton's interpreter, which a CUDA machine's "
                    "test run does not enable (its kernels compile for CUDA); the layer "
                    "benchmark's tiny config is CPU-only, its CUDA configs are full size")
def test_layer_cpu_smoke(tmp_path):
    """The layer benchmark's tiny CPU case (``--quick``: d_model 24, 4 experts, 16 tokens).
    Skipped on a CUDA machine like :func:`test_cpu_smoke`: in a process where cake compiles
    for CUDA the launch checks refuse CPU tensors."""
    out = tmp_path / "layer.json"
    assert layer_bench.main(["--device", "cpu", "--quick", "--dtype", "fp32", "--out",
                             str(out)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    assert res["impls"]["cake"]["bitwise_repeat"] and set(res["ratios"]) == {"fwd", "fwd_bwd"}
    assert max(res["max_rel_gap"].values()) < 1e-4  # same math, fp32
