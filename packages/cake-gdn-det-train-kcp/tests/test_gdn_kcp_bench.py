"""The benchmark's shared document builder, and a CPU smoke run where a rank receives no token."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from _gdn_kcp_helpers import DEV
from cake_core import kcp_bench
from cake_core.testing import kcp_smoke_device

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cake_gdn_det_train_kcp.py"
_spec = importlib.util.spec_from_file_location("bench_gdn_kcp", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_documents_from_cake_core():
    """The document builder is cake_core.kcp_bench's (tested there, with every boundary
    kind and layout)."""
    assert bench.make_cu is kcp_bench.make_cu


def test_smoke_two_ranks_one_token(tmp_path):
    """``--seqlen 1 --docs 1`` on two ranks: rank 0 holds nothing, skips its kernels and
    still takes part; with --check the other rank's results equal the single-rank ones."""
    out = tmp_path / "r.json"
    device, env = kcp_smoke_device(2, DEV)
    r = subprocess.run([sys.executable, str(BENCH), "--world-size", "2", "--device", device,
                        "--seqlen", "1", "--docs", "1", "--heads", "1", "--v-heads", "1",
                        "--head-dim", "16", "--dtype", "fp32", "--base", "local", "--check",
                        "--exchange", "ring", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert [x["tokens"] for x in d["ranks"]] == [0, 1]
    assert d["repeat_bitwise_all_ranks"] and d["max_rel_err"] == 0.0
    assert d["local_fwd_bwd_ms"] > 0 and d["ranks"][0]["bytes"]["calls"] == 0
