"""comm_bytes against the bytes the collectives move in a gloo run (issue 45): each case's
second step (after the ranks' one-time agreement) is counted by wrapping
``torch.distributed.all_gather`` / ``batch_isend_irecv`` (``_kcp_worker.py``); the first
step moves the two agreements' 16 bytes per rank more."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kcp_worker", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


@pytest.mark.parametrize("W, names", [
    (2, ["w2_contig_ag", "w2_zigzag_ring"]),
    (3, ["w3_zigzag_ag", "w3_contig_ring"]),  # middle fragments: the wider all-gather rows
])
def test_comm_bytes_is_what_the_collectives_move(tmp_path, W, names):
    if torch.cuda.is_available() and torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(_HERE / "_kcp_worker.py"), str(W), str(tmp_path),
                        ",".join(names)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    results = [torch.load(tmp_path / f"rank{rank}.pt", map_location="cpu") for rank in range(W)]
    for name in names:
        for rank, res in enumerate(results):
            assert "error" not in res[name], res[name]["error"]
            moved, want = res[name]["moved"], res[name]["comm_bytes"]
            assert moved == want, (name, rank, moved, want)
            # the first step adds the forward's and the backward's agreement: one
            # all-gather of 16 bytes per rank each
            first = res[name]["moved_first"]
            assert {k: first[k] - moved[k] for k in moved} == {
                "fwd_sent": 16, "fwd_received": 16 * (W - 1), "bwd_sent": 16,
                "bwd_received": 16 * (W - 1), "calls": 2}, (name, rank, first, moved)
        # something crossed: the counts are not vacuous
        assert sum(res[name]["moved"]["fwd_received"] for res in results) > 0, name
        assert sum(res[name]["moved"]["bwd_received"] for res in results) > 0, name
