"""The benchmark imports and runs one tiny case on the tests' device (DEV): the CPU through
Triton's interpreter without CUDA, the GPU on a CUDA machine."""

import importlib.util
import json
from pathlib import Path

from _mhc_cases import DEV

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cake_mhc_det_train.py"
_spec = importlib.util.spec_from_file_location("bench_mhc", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_compulsory_bytes():
    b = bench.compulsory_bytes(16384, 4, 4096, 2)
    assert b["fwd"] == 14 * 16384 * 4096 * 2 and b["fwd_bwd"] == 29 * 16384 * 4096 * 2


def test_smoke(tmp_path):
    """One tiny case (8 tokens, C = 16, fp32) on DEV, in this process. Not ``--device cpu``
    on a CUDA machine: there this process compiles the kernels for CUDA (the interpreter is
    chosen once per process, before the kernels are defined), so the launch checks refuse
    CPU tensors."""
    out = tmp_path / "mhc.json"
    rc = bench.main(["--device", DEV.type, "--quick", "--tokens", "8", "--hidden", "16",
                     "--iters", "3", "--impls", "cake,torch", "--dtype", "fp32",
                     "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    assert len(res) == 1
    impls = res[0]["impls"]
    assert set(impls) == {"cake", "torch"}
    assert impls["cake"]["bitwise_repeat"] is True
    assert max(impls["cake"]["rel_err_vs_fp64"].values()) < 1e-4
    assert max(impls["torch"]["rel_diff_vs_cake"].values()) < 1e-4
    for ph in bench.PHASES:
        assert impls["cake"][ph]["ms"] > 0 and "pct_roofline" in impls["cake"][ph]
