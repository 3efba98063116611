"""The benchmark's CPU smoke run on two ranks: nondet and det KCP timed on the same documents,
the ratio reported, the nondet run compared with the single-rank det package."""

import json
import subprocess
import sys
from pathlib import Path

from cake_core.testing import kcp_smoke_device
from cake_core.triton_utils import default_device

BENCH = (Path(__file__).resolve().parents[1] / "benchmarks"
         / "bench_cake_kda_nondet_train_kcp.py")


def test_smoke_two_ranks(tmp_path):
    out = tmp_path / "r.json"
    device, env = kcp_smoke_device(2, default_device())
    r = subprocess.run([sys.executable, str(BENCH), "--world-size", "2", "--device", device,
                        "--seqlen", "70", "--docs", "2", "--heads", "1", "--v-heads", "1",
                        "--head-dim", "16", "--dtype", "fp32", "--reps", "1", "--check",
                        "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["ratio_nondet_over_det"] > 0 and d["det_kcp_fwd_bwd_ms_slowest_rank"] > 0
    assert d["repeat_bitwise_all_ranks"] and d["max_rel_err"] < 1e-4
    assert all("det_kcp" in rec for rec in d["ranks"])
