"""comm_bytes against the bytes the collectives move in a gloo run (issue 45): one more
steady-state step per case (after the ranks' one-time agreement, gate-parameter gradients
reduced) is counted by wrapping ``torch.distributed.all_gather`` / ``batch_isend_irecv``
(``_kcp_worker.py``)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kda_kcp_worker_cb", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

NPROC = 3
#: all-gather with the gate-parameter row, the ring, a middle fragment (wider rows)
NAMES = ["w2_zigzag_ring", "w3_zigzag_ag", "w3_contig_ring"]


def test_comm_bytes_is_what_the_collectives_move(tmp_path):
    if torch.cuda.is_available() and torch.cuda.device_count() < NPROC:
        pytest.skip(f"needs {NPROC} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(_HERE / "_kcp_worker.py"), str(NPROC),
                        str(tmp_path), ",".join(NAMES)], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    procs = [torch.load(tmp_path / f"proc{p}.pt", map_location="cpu") for p in range(NPROC)]
    for name in NAMES:
        per_rank = [procs[p][name] for p in worker.procs_of(worker.CASES[name][0], NPROC)]
        for rank, res in enumerate(per_rank):
            assert "error" not in res, res["error"]
            assert res["moved"] == res["comm_bytes"], (name, rank, res["moved"])
        assert sum(res["moved"]["fwd_received"] for res in per_rank) > 0, name
        assert sum(res["moved"]["bwd_received"] for res in per_rank) > 0, name
