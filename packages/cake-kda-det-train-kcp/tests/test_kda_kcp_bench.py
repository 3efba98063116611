"""The benchmark's shared document builder, and a CPU smoke run on two ranks where rank 0
receives no token (FLA's gate, the ring, --base local and --check)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _kda_kcp_helpers import DEV
from cake_core import kcp_bench
from cake_core.testing import kcp_smoke_device

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cake_kda_det_train_kcp.py"
_spec = importlib.util.spec_from_file_location("bench_kda_kcp", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_documents_from_cake_core():
    """The document builder is cake_core.kcp_bench's (tested there, with every boundary
    kind and layout)."""
    assert bench.make_cu is kcp_bench.make_cu


def test_arguments():
    a = bench.parse_args(["--gate", "softplus", "--no-reduce-gate-grads", "--seqlen", "8"])
    assert a.gate == "softplus" and a.no_reduce_gate_grads and a.seqlen == 8
    with pytest.raises(SystemExit):
        bench.parse_args(["--docs", "9", "--seqlen", "8"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--heads", "2", "--v-heads", "3"])


def test_smoke_two_ranks_one_token(tmp_path):
    """``--seqlen 1 --docs 1`` on two ranks: rank 0 holds nothing, skips its kernels and
    still takes part (the gate-parameter sum too); with --check the results equal the
    single-rank ones (one rank holds every token, and 0 + x = x)."""
    out = tmp_path / "r.json"
    device, env = kcp_smoke_device(2, DEV)
    r = subprocess.run([sys.executable, str(BENCH), "--world-size", "2", "--device", device,
                        "--seqlen", "1", "--docs", "1", "--heads", "1", "--v-heads", "1",
                        "--head-dim", "16", "--dtype", "fp32", "--base", "local", "--check",
                        "--exchange", "ring", "--gate", "softplus", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [x["tokens"] for x in d["ranks"]] == [0, 1]
    assert d["repeat_bitwise_all_ranks"] and d["max_rel_err"] == 0.0
    assert set(d["ranks"][1]["rel_err"]) == set(bench.GRAD_NAMES)
    assert d["local_fwd_bwd_ms"] > 0 and d["ranks"][0]["bytes"]["calls"] == 1
    assert d["gate"] == "softplus" and d["reduce_gate_param_grads"]


def test_documented_cpu_smoke_command_crosses_a_rank():
    """Breaker finding: the documented CPU command (``--seqlen 100 --docs 2`` on two ranks,
    default ``--boundary random``, seed 0) put its one document boundary exactly on the rank
    cut (``cu = [0, 50, 100]``), so no state crossed a rank and its ``--check`` exercised no
    exchange. The documented command must send at least one state."""
    import shlex

    from cake_kda_det_train_kcp import partition_det_kcp

    text = bench.__doc__  # the benchmark's own docstring documents the command
    lines = text.replace("\\\n", " ").splitlines()
    cmd = next(ln for ln in lines if "--device cpu" in ln and "bench_cake_kda" in ln)
    argv = shlex.split(cmd)
    a = bench.parse_args(argv[argv.index(next(x for x in argv if x.endswith(".py"))) + 1:])
    cu = bench.make_cu(a.seqlen, a.docs, a.boundary, a.layout, a.world_size, a.seed)
    part = partition_det_kcp(torch.tensor(cu), a.world_size, a.layout)
    frags = [f for r in range(a.world_size) for f in part.fragments(r)]
    assert any(f.next_rank is not None for f in frags), (cu, frags)
