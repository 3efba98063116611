"""Two gloo processes on the CPU (NCCL with two GPUs): each case's ranks' outputs and
gradients, put back in global order, against cake-kda-nondet-train on the global tensors
(within float tolerance; the bits are not promised), the low-level pair and the autograd
entry; dA_log / ddt_bias summed over the ranks (the same bits on both)."""

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _kda_nd_kcp_helpers import assert_close_all, global_inputs, single_rank
from cake_core.testing import bitwise_equal, computed_once

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_nd_kcp_worker", _HERE / "_nd_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
NPROC = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The ranks' results of every case, from one spawn per test run (pytest-xdist workers
    share it)."""
    if torch.cuda.is_available() and torch.cuda.device_count() < NPROC:
        pytest.skip(f"needs {NPROC} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    return computed_once(tmp_path_factory, "kda_nd_kcp_dist", lambda: _spawn(tmp_path_factory))


@functools.cache
def _single_rank(name):
    """cake-kda-nondet-train on a case's global tensors (shared by its two runs)."""
    case = worker.CASES[name]
    xs, kw = global_inputs(case[0][-1], seed=case[3], device="cpu")
    return single_rank(xs, case[0], kw)


def _spawn(tmp_path_factory):
    out = tmp_path_factory.mktemp("kda_nd_kcp_dist")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    done = subprocess.run([sys.executable, str(_HERE / "_nd_kcp_worker.py"), str(NPROC),
                           str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), \
        done.stdout + done.stderr[-4000:]
    return [torch.load(out / f"proc{p}.pt", map_location="cpu") for p in range(NPROC)]


@pytest.mark.parametrize("name", list(worker.CASES))
@pytest.mark.parametrize("run", ["low", "autograd"])
def test_ranks_against_single_rank(results, name, run):
    case = worker.CASES[name]
    for r in range(NPROC):
        assert "error" not in results[r][name], results[r][name].get("error")
    want = _single_rank(name)
    p = worker.partition_of(case, NPROC)
    got = []
    for i in range(6):  # o and the per-token gradients, back in global order
        g = torch.empty_like(want[i])
        for r in range(NPROC):
            g[:, p.global_index(r)] = results[r][name][run][i]
        got.append(g)
    gate = [results[0][name][run][i] for i in (6, 7)]
    assert_close_all(got + gate, want)
    for i in (6, 7):  # the rank-order sum: the same bits on every rank
        assert all(bitwise_equal(results[r][name][run][i], gate[i - 6])
                   for r in range(NPROC))
    for r in range(NPROC):  # comm_bytes_nondet: what the collectives moved (issue 45)
        assert results[r][name]["moved"] == results[r][name]["comm_bytes"], (name, r)
