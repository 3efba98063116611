"""dist / gate / ring: several gloo processes on the CPU against the single-rank package.

One spawn of four processes (``_kcp_worker.py``) runs every case, those of world size 2
and 3 in subgroups of the last two / three processes (group ranks differ from global
ranks); here the ranks' outputs and gradients are put back in global order and compared with
cake-kda-det-train on the global tensors: within float tolerance, bitwise for the ring
with every cut on a chunk boundary. Every case also ran twice inside each rank and must
have repeated bitwise; dA_log / ddt_bias (reduced) must be the same bits on every rank,
and each rank's share (``reduce_gate_param_grads=False``) must add up, in rank order, to
exactly the reduced bits. Each rank's ``comm_bytes`` must equal the bytes its collectives
moved in one more steady-state step (issue 45; counted by wrapping
``torch.distributed.all_gather`` / ``batch_isend_irecv`` in ``_kcp_worker.py``).
"""

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _kda_kcp_helpers import DEV, GATE_TOL, TOL, single_rank
from cake_core.testing import bitwise_equal, computed_once, rel_fro_error

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kda_kcp_worker", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

TOKEN_NAMES = worker.NAMES[:6]
GATE_NAMES = worker.NAMES[6:]


#: processes of the one spawn: every world size runs on the last W of them
NPROC = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One spawn of NPROC gloo processes runs every case of every world size (while this
    process computes the single-rank references: ring steps leave cores idle), once per
    test run (pytest-xdist workers share it); returns
    ``({case name: [per group rank results]}, [per process results], {case name: its
    single-rank reference})``."""
    if torch.cuda.is_available() and torch.cuda.device_count() < NPROC:
        pytest.skip(f"needs {NPROC} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    return computed_once(tmp_path_factory, "kda_kcp_dist", lambda: _spawn(tmp_path_factory))


def _spawn(tmp_path_factory):
    out = tmp_path_factory.mktemp("kda_kcp_dist")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    proc = subprocess.Popen([sys.executable, str(_HERE / "_kcp_worker.py"), str(NPROC),
                             str(out), ",".join(W2 + W3 + W4)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        for name in W2 + W3 + W4:
            _single_rank(worker.CASES[name])
        stdout, stderr = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and stdout.strip().endswith("ok"), stdout + stderr[-4000:]
    procs = [torch.load(out / f"proc{p}.pt", map_location="cpu") for p in range(NPROC)]
    by_case = {}
    for name, case in worker.CASES.items():
        if name in W2 + W3 + W4:
            by_case[name] = [procs[p][name] for p in worker.procs_of(case[0], NPROC)]
    refs = {name: _single_rank(worker.CASES[name]) for name in W2 + W3 + W4}
    return by_case, procs, refs


@functools.cache
def _single_rank_of(cu, kind, HV, seed):
    xs, kw = worker.case_inputs((None, list(cu), None, None, kind, HV, seed, ()), DEV)
    got = single_rank(xs, list(cu), kw)
    return {n: (t.cpu() if t is not None else None)
            for n, t in zip(worker.NAMES, got, strict=True)}


def _single_rank(case):
    """cake-kda-det-train on the global tensors (cases that differ only by exchange or
    flags share it)."""
    return _single_rank_of(tuple(case[1]), case[4], case[5], case[6])


def _check_gate(name, case, per_rank, ref):
    for n in GATE_NAMES:
        if ref[n] is None:
            assert all(res[n] is None for res in per_rank), (name, n)
            continue
        first = per_rank[0][n]
        for r, res in enumerate(per_rank):  # one sum, the same bits on every rank
            assert bitwise_equal(res[n], first), f"{name}: {n} differs on rank {r}"
        err = rel_fro_error(first, ref[n])
        assert err < GATE_TOL, f"{name}: {n} rel. error {err:.2e}"
        if "share" in case[7]:  # the shares, added in rank order, are the reduced bits
            total = per_rank[0][f"share_{n}"].clone()
            for res in per_rank[1:]:
                total.add_(res[f"share_{n}"])
            assert bitwise_equal(total, first), f"{name}: {n} shares"
            assert not any(bitwise_equal(res[f"share_{n}"], first) for res in per_rank), \
                f"{name}: a rank's share is the whole sum"


def _check(results, names):
    by_case, procs, refs = results
    for p, res in enumerate(procs):
        assert res["sum_over_ranks_ok"], f"process {p}: sum_over_ranks order"
    for name in names:
        case = worker.CASES[name]
        per_rank = by_case[name]
        assert len(per_rank) == case[0]
        for r, res in enumerate(per_rank):
            assert "error" not in res, f"{name} rank {r}:\n{res['error']}"
            assert res["repeat"], f"{name} rank {r}: a second run gave other bits"
            assert res["moved"] == res["comm_bytes"], (name, r, res["moved"])
            calls = res["local_calls"]
            if res["num_tokens"] == 0:  # an empty rank runs no kernel (it joins collectives)
                assert calls == {"fwd": 0, "bwd": 0}, (name, r, calls)
            else:
                assert 1 <= calls["fwd"] <= 6 and 1 <= calls["bwd"] <= 5, (name, r, calls)
        if name != "w2_empty_ag":  # a document crosses ranks: the byte counts are not vacuous
            for phase in ("fwd_received", "bwd_received"):
                assert sum(res["moved"][phase] for res in per_rank) > 0, (name, phase)
        p = worker.partition_of(case)
        ref = refs[name]
        for t in TOKEN_NAMES:
            got = torch.full_like(ref[t], float("nan"))
            for r, res in enumerate(per_rank):
                got[:, p.global_index(r)] = res[t]
            if "aligned" in case[7]:
                assert bitwise_equal(got, ref[t]), f"{name}: {t} not bitwise the single rank's"
            else:
                err = rel_fro_error(got, ref[t])
                assert err < TOL, f"{name}: {t} rel. error {err:.2e}"
        _check_gate(name, case, per_rank, ref)
    return by_case


W2 = ["w2_contig_ag", "w2_aligned_ring", "w2_zigzag_ag", "w2_zigzag_ring", "w2_empty_ag"]
W3 = ["w3_contig_ring", "w3_empty_ag", "w3_empty_ring", "w3_zigzag_ag", "w3_zigzag_ring"]
W4 = ["w4_contig_ag"]


def test_dist_world_size_2(results):
    """Both layouts and exchanges with FLA's gate (reduced and local gate-parameter
    gradients), a 1-token fragment, an empty shard, the autograd entry, the chunk-aligned
    ring (bitwise), and bad inputs on a live group (ValueError, no collective)."""
    by_case = _check(results, W2)
    for r in range(2):
        msgs = by_case["w2_zigzag_ag"][r]["bad"]
        assert not [m for m in msgs if m.startswith(("NO ERROR", "COLLECTIVE"))], msgs
        assert len(msgs) == 10, msgs
        assert msgs[0].endswith("partition: made for world_size 3, but the process group has "
                                "2 ranks"), msgs[0]
        assert f"ctx: made for rank {1 - r}, but this process is rank {r}" in msgs[1], msgs[1]
        assert "q: holds" in msgs[2] and "q: expected dtype" in msgs[3], msgs
        assert "g: expected shape" in msgs[4] and "A_log: required" in msgs[5], msgs
        assert "reduce_gate_param_grads" in msgs[6], msgs
        assert f"ctx: made for rank {1 - r}" in msgs[7] and "do: expected shape" in msgs[8]
        assert "reduce_gate_param_grads" in msgs[9], msgs


def test_dist_world_size_3(results):
    """Both layouts and exchanges: a document over every rank (middle fragments; zigzag
    revisits ranks) with strong per-channel decays, the lower-bound gate with the L2 norm
    (local shares, the autograd entry), empty ranks with 1-token fragments."""
    _check(results, W3)


def test_dist_world_size_4(results):
    """One document over all four ranks: a fold of three summaries (two transitions)."""
    _check(results, W4)


@pytest.mark.parametrize("name", sorted(worker.CASES))
def test_cases_are_what_they_claim(name):
    """The partitions exercise what the case names and comments say (host metadata)."""
    from cake_core.kcp import build_context

    case = worker.CASES[name]
    W = case[0]
    p = worker.partition_of(case)
    ctxs = [build_context(p, None, r, "cpu", exchange=case[3], check_group=False)
            for r in range(W)]
    assert p.world_size == W
    assert any(c.crosses for c in ctxs) == (name != "w2_empty_ag")
    frags = [f for c in ctxs for f in c.fragments]
    if "empty" in name:
        assert any(c.is_empty for c in ctxs)
    if name.startswith(("w2_contig", "w3_empty")):
        assert any(f.length == 1 and f.has_next for f in frags)
    if name.startswith(("w3", "w4")) and "empty" not in name:
        assert any(f.has_prev and f.has_next for f in frags)
    if "zigzag" in name:  # a document comes back to a rank, or goes to a lower one
        assert any([r for r, _ in p.doc_chain(d)] != sorted(r for r, _ in p.doc_chain(d))
                   for d in range(p.num_docs))
    if name.startswith("w3_zigzag"):  # a rank holds two fragments of one document
        assert any(len({r for r, _ in p.doc_chain(d)}) < len(p.doc_chain(d))
                   for d in range(p.num_docs))
    if "aligned" in case[7]:
        assert all(f.doc_offset % 64 == 0 for f in frags)
    elif "empty" not in name:  # some cut falls inside a 64-token chunk
        assert any(f.doc_offset % 64 for f in frags)
