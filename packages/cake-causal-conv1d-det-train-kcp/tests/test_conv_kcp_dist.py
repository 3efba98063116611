"""Several gloo processes on the CPU against the single-rank package and float64.

Each test spawns one process group (``_kcp_worker.py``: W = 2, 3, 4) that runs its cases;
here the ranks' outputs and input gradients are put back in global order and compared with
cake-causal-conv1d-det-train and with the float64 reference on the global tensors, and the
dweight / dbias shares are summed in rank order. Every case also ran twice inside each
rank and must have repeated bitwise; the reduced gradients of a
``reduce_weight_grads=True`` run must be the same bits on every rank and equal to the
rank-order sum of the shares (so they repeat too).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _conv_kcp_helpers import DEV, TOL, reference64, single_rank
from cake_core.testing import bitwise_equal, rel_fro_error

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kcp_worker", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def _spawn(tmp_path, W, names):
    if torch.cuda.is_available() and torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(_HERE / "_kcp_worker.py"), str(W), str(tmp_path),
                        ",".join(names)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    return [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(W)]


def _rank_sum(ts):
    s = ts[0].clone()
    for t in ts[1:]:
        s = s + t
    return s


def _expected_gathers(case):
    """All-gathers of the first forward + backward on a context and of a later one with
    reduced weight gradients: the forward's when a halo row crosses a rank, the backward's
    when a halo gradient does or the weight gradients are reduced; the first forward and
    backward add one agreement all-gather each (``cake_core.kcp.agree_once``)."""
    from cake_causal_conv1d_det_train_kcp.context import halo_plan

    hp = halo_plan(worker.partition_of(case), case.kernel_size)
    crosses = case.world > 1 and hp.fwd_rows_per_rank > 0
    return 2 * int(crosses) + 2, int(crosses) + int(case.world > 1)


def _check(results, names):
    reordered_differs = []
    for name in names:
        case = worker.CASES[name]
        W = case.world
        per_rank = [results[r][name] for r in range(W)]
        plain, red = _expected_gathers(case)
        for r, res in enumerate(per_rank):
            assert "error" not in res, f"{name} rank {r}:\n{res['error']}"
            assert res["repeat"], f"{name} rank {r}: not repeated bitwise"
            assert res["moved"] == res["comm_bytes"], (name, r, res["moved"])
            assert res["red_same_y_dx"], f"{name} rank {r}: reduce changed y or dx"
            # every rank joins every collective, an empty one too; an empty one runs no kernel
            assert res["calls"]["gather"] == plain, (name, r, res["calls"])
            assert res["calls_red"]["gather"] == red, (name, r, res["calls_red"])
            n_local = 0 if res["num_tokens"] == 0 else 1
            assert res["calls"]["fwd"] == res["calls"]["bwd"] == n_local, (name, r, res)
            for flag in ("autograd_same", "autograd_red_same"):
                if flag in res:
                    assert res[flag], f"{name} rank {r}: autograd != low level ({flag})"
        p = worker.partition_of(case)
        xs = worker.global_inputs(case, DEV)
        refs = {"local": single_rank(xs, case.cu, case.activation),
                "float64": reference64(xs, case.cu, case.activation)}
        got = {}
        for i, t in enumerate(("y", "dx")):
            g = torch.full(refs["local"][i].shape, float("nan"))
            for r, res in enumerate(per_rank):
                g[:, p.global_index(r)] = res[t]
            got[t] = g
        for t in ("dweight", "dbias"):
            shares = [res[t] for res in per_rank]
            if shares[0] is None:
                assert all(s is None and res[t + "_red"] is None
                           for s, res in zip(shares, per_rank, strict=True)), name
                got[t] = None
                continue
            total = _rank_sum(shares)
            for r, res in enumerate(per_rank):  # the same bits everywhere: the rank-order sum
                assert bitwise_equal(res[t + "_red"], total), f"{name} rank {r}: {t} reduced"
            got[t] = total
            if W >= 3:
                reordered_differs.append(not bitwise_equal(_rank_sum(shares[::-1]), total))
        for i, t in enumerate(worker.NAMES):
            for label, ref in refs.items():
                if got[t] is None:
                    assert ref[i] is None
                    continue
                err = rel_fro_error(got[t], ref[i].cpu().to(got[t].dtype))
                assert err < TOL, f"{name}: {t} vs {label}: rel. error {err:.2e}"
    return reordered_differs


W2 = ["w2_contig_k4_silu", "w2_zigzag_k3", "w2_empty_k2", "w2_len1_k4"]
W3 = ["w3_contig_k4", "w3_zigzag_k3", "w3_short_k4", "w3_empty_k2"]
W4 = ["w4_contig_k3", "w4_zigzag_k4", "w4_explicit_k4"]


def test_dist_world_size_2(tmp_path):
    """Both layouts, an empty shard, 1-token fragments (halos from both ranks), the
    autograd entry, and bad inputs on a live group (ValueError, no collective)."""
    results = _spawn(tmp_path, 2, W2)
    _check(results, W2)
    for r in range(2):
        msgs = results[r]["w2_len1_k4"]["bad"]
        assert not [m for m in msgs if m.startswith(("NO ERROR", "COLLECTIVE"))], msgs
        assert len(msgs) == 9, msgs
        assert msgs[0].endswith("partition: made for world_size 3, but the process group has "
                                "2 ranks"), msgs[0]
        assert f"ctx: made for rank {1 - r}, but this process is rank {r}" in msgs[1], msgs[1]
        assert "x: holds" in msgs[2] and "x: expected dtype" in msgs[3], msgs
        assert "ctx: built with conv_kernel_size=3, but weight has W=4" in msgs[4], msgs[4]
        assert "reduce_weight_grads: expected a bool" in msgs[5], msgs[5]
        assert f"ctx: made for rank {1 - r}" in msgs[6] and "dy: expected shape" in msgs[7]
        assert "reduce_weight_grads: expected a bool" in msgs[8], msgs[8]


def test_dist_world_size_3_and_4(tmp_path):
    """A document over every rank, a zigzag chain that returns to a rank, halos spanning
    several ranks (fragments shorter than W - 1), empty shards. With three or more shares,
    summing them in another order changes some bits: the rank order is what makes the
    reduced gradients equal everywhere and across runs."""
    differs = _check(_spawn(tmp_path / "w3", 3, W3), W3)
    differs += _check(_spawn(tmp_path / "w4", 4, W4), W4)
    assert any(differs), "no case shows that the order of the rank sum matters"


@pytest.mark.parametrize("name", sorted(worker.CASES))
def test_cases_are_what_they_claim(name):
    """The partitions exercise what the case names say (host metadata only)."""
    from cake_core.kcp import build_context

    case = worker.CASES[name]
    W = case.world
    p = worker.partition_of(case)
    ctxs = [build_context(p, None, r, "cpu", case.kernel_size, check_group=False)
            for r in range(W)]
    assert p.world_size == W
    crossing = [pc for c in ctxs for e in c.halo for pc in e.pieces if pc.src_rank != c.rank]
    assert bool(crossing) == ("empty_k2" not in name or W == 3)
    if "empty" in name or "explicit" in name:
        assert any(c.is_empty for c in ctxs)
    if "len1" in name or "short" in name:
        assert any(f.length == 1 and f.has_next for c in ctxs for f in c.fragments)
    if "short" in name or "explicit" in name or name == "w4_zigzag_k4":  # a halo over ranks
        assert any(len({pc.src_rank for pc in e.pieces}) >= 2 for c in ctxs for e in c.halo)
    if "zigzag" in name and W > 2:  # a document comes back to a rank
        assert any(len({r for r, _ in p.doc_chain(d)}) < len(p.doc_chain(d))
                   for d in range(p.num_docs))
