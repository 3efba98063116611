"""Two gloo processes on the CPU (NCCL with two GPUs): both exchanges against
cake-gdn-nondet-train on the global tensors, the autograd entry against the low-level
pair."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _gdn_nd_kcp_helpers import DEV, global_inputs, single_rank
from cake_core.testing import rel_fro_error

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_nd_kcp_worker", _HERE / "_nd_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

W = 2
TOL = 2e-5  # fp32: the fold reassociates the recurrence and cuts regroup chunks


def test_two_ranks_match_single_rank(tmp_path):
    if torch.cuda.is_available() and torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, str(_HERE / "_nd_kcp_worker.py"), str(W),
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    res = [torch.load(tmp_path / f"rank{i}.pt", map_location="cpu") for i in range(W)]
    for name, case in worker.CASES.items():
        cu, _, _, l2, HV, seed = case
        want = single_rank(global_inputs(cu[-1], HV=HV, seed=seed), cu, l2)
        p = worker.partition_of(case, W)
        for i, n in enumerate(worker.NAMES):
            got = torch.empty_like(want[i], device="cpu")
            for rank in range(W):
                assert "error" not in res[rank][name], res[rank][name].get("error")
                got[:, p.global_index(rank)] = res[rank][name][n]
            err = rel_fro_error(got.to(DEV), want[i])
            assert err < TOL, (name, n, err)
        assert all(res[rank][name]["autograd_same"] for rank in range(W)), name
        for rank in range(W):  # comm_bytes_nondet: what the collectives moved (issue 45)
            assert res[rank][name]["moved"] == res[rank][name]["comm_bytes"], (name, rank)
