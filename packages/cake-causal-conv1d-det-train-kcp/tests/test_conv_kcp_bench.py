"""The benchmark's shared document builder, and a CPU run on three ranks where rank 0 holds no
token and rank 2's halo comes from rank 1."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from _conv_kcp_helpers import DEV
from cake_core import kcp_bench
from cake_core.testing import kcp_smoke_device

BENCH = (Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_causal_conv1d_det_train_kcp.py")
_spec = importlib.util.spec_from_file_location("bench_conv_kcp", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_documents_from_cake_core():
    """The document builder is cake_core.kcp_bench's (tested there, with every boundary
    kind and layout)."""
    assert bench.make_cu is kcp_bench.make_cu


def test_smoke_three_ranks_two_tokens(tmp_path):
    """``--seqlen 2 --docs 1`` on three ranks: rank 0 holds nothing (runs no kernel, joins
    every collective), rank 2's halo is rank 1's token; with --check every rank's y, dx
    and the reduced dweight / dbias match the single-rank package, repeat bitwise, and the
    reduced gradients are the same bits on every rank."""
    out = tmp_path / "r.json"
    device, env = kcp_smoke_device(3, DEV)
    r = subprocess.run([sys.executable, str(BENCH), "--world-size", "3", "--device", device,
                        "--seqlen", "2", "--docs", "1", "--hidden", "8", "--kernel-size", "3",
                        "--dtype", "fp32", "--bias", "--reduce-weight-grads", "--base",
                        "local", "--check", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [x["tokens"] for x in d["ranks"]] == [0, 1, 1]
    assert d["repeat_bitwise_all_ranks"] and d["reduced_same_bits_all_ranks"]
    assert d["max_rel_err"] < 1e-6
    assert d["local_fwd_bwd_ms"] > 0
    assert [x["bytes"]["calls"] for x in d["ranks"]] == [2, 2, 2]
    assert [x["bytes"]["halo_rows_out"] for x in d["ranks"]] == [0, 1, 0]
