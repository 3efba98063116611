"""comm_bytes against the bytes the collectives move in a gloo run (issue 45): one more
steady-state step per case (after the ranks' one-time agreement), without and with
``reduce_weight_grads``, is counted by wrapping ``torch.distributed.all_gather`` /
``batch_isend_irecv`` (``_kcp_worker.py``)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_conv_kcp_worker_cb", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


@pytest.mark.parametrize("W, names", [(2, ["w2_zigzag_k3", "w2_empty_k2"]),
                                      (3, ["w3_zigzag_k3"])])
def test_comm_bytes_is_what_the_collectives_move(tmp_path, W, names):
    if torch.cuda.is_available() and torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(_HERE / "_kcp_worker.py"), str(W), str(tmp_path),
                        ",".join(names)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    results = [torch.load(tmp_path / f"rank{rank}.pt", map_location="cpu") for rank in range(W)]
    for name in names:
        for rank, res in enumerate(results):
            assert "error" not in res[name], res[name]["error"]
            moved, want = res[name]["moved"], res[name]["comm_bytes"]
            assert moved == want, (name, rank, moved, want)
        # with reduce_weight_grads every rank sends its weight-gradient share
        assert all(res[name]["moved"][1]["bwd_sent"] > 0 for res in results), name
        if "empty" not in name:  # halos cross
            assert sum(res[name]["moved"][0]["fwd_received"] for res in results) > 0, name
