"""dist / l2n / ring: several gloo processes on the CPU against the single-rank package.

Each test spawns one process group (``_kcp_worker.py``: W = 2, 3, 4) that runs its cases;
here the ranks' outputs and gradients are put back in global order and compared with
cake-gdn-det-train on the global tensors: within float tolerance, bitwise for the ring
with every cut on a chunk boundary. Every case also ran twice inside each rank and must
have repeated bitwise.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _gdn_kcp_helpers import DEV
from cake_core.testing import bitwise_equal, rel_fro_error

_HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_kcp_worker", _HERE / "_kcp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

#: relative Frobenius error allowed against the single-rank package (fp32; the fold
#: reassociates the recurrence and cuts regroup chunks)
TOL = 2e-5


def _spawn(tmp_path, W, names):
    if torch.cuda.is_available() and torch.cuda.device_count() < W:
        pytest.skip(f"needs {W} GPUs for NCCL (or no CUDA: gloo on the CPU)")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(_HERE / "_kcp_worker.py"), str(W), str(tmp_path),
                        ",".join(names)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-4000:]
    return [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(W)]


def _single_rank(case):
    from cake_gdn_det_train import chunk_gdn_det_bwd, chunk_gdn_det_fwd

    _, cu, _, _, l2, HV, seed, _ = case
    q, k, v, g, beta, do = worker.global_inputs(cu[-1], HV, seed, DEV)
    o, _, saved = chunk_gdn_det_fwd(q, k, v, g, beta, use_qk_l2norm_in_kernel=l2,
                                    cu_seqlens=torch.tensor(cu, dtype=torch.int64, device=DEV))
    gr = chunk_gdn_det_bwd(do, None, saved)
    return {n: t.cpu() for n, t in zip(worker.NAMES, (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta),
                                       strict=True)}


def _check(results, names):
    for name in names:
        case = worker.CASES[name]
        W = case[0]
        per_rank = [results[r][name] for r in range(W)]
        for r, res in enumerate(per_rank):
            assert "error" not in res, f"{name} rank {r}:\n{res['error']}"
            assert res["repeat"], f"{name} rank {r}: a second run gave other bits"
            assert res["moved"] == res["comm_bytes"], (name, r, res["moved"])
            calls = res["local_calls"]
            if res["num_tokens"] == 0:  # an empty rank runs no kernel (it joins collectives)
                assert calls == {"fwd": 0, "bwd": 0}, (name, r, calls)
            else:
                assert 1 <= calls["fwd"] <= 6 and 1 <= calls["bwd"] <= 5, (name, r, calls)
            if "autograd_same" in res:
                assert res["autograd_same"], f"{name} rank {r}: autograd != low level"
        p = worker.partition_of(case)
        ref = _single_rank(case)
        for t in worker.NAMES:
            got = torch.full_like(ref[t], float("nan"))
            for r, res in enumerate(per_rank):
                got[:, p.global_index(r)] = res[t]
            if "aligned" in case[7]:
                assert bitwise_equal(got, ref[t]), f"{name}: {t} not bitwise the single rank's"
            else:
                err = rel_fro_error(got, ref[t])
                assert err < TOL, f"{name}: {t} rel. error {err:.2e}"
    return results


W2 = ["w2_contig_ag", "w2_contig_ring", "w2_zigzag_ag", "w2_zigzag_ring", "w2_zdoc_ag",
      "w2_empty_ag", "w2_l2n_ag"]
MISMATCH = "w2_mismatch"
W3 = ["w3_contig_ag", "w3_contig_ring", "w3_zigzag_ag", "w3_zigzag_ring", "w3_empty_ag",
      "w3_empty_ring", "w3_aligned_ring", "w3_aligned_ring_l2n"]
W4 = ["w4_zigzag_ag", "w4_zigzag_ring"]


def test_dist_world_size_2(tmp_path):
    """Both layouts and exchanges, a 1-token fragment, an empty shard, the L2 norm, the
    autograd entry, bad inputs on a live group (ValueError, no collective), and ranks
    given different partitions (every rank raises, naming the partition)."""
    results = _check(_spawn(tmp_path, 2, [*W2, MISMATCH]), W2)
    for r in range(2):
        msg = results[r][MISMATCH]["mismatch"]
        assert msg is not None and msg.startswith(
            "chunk_gdn_fwd_kcp: the ranks of ctx.group disagree before the first collective: "
            'layout: rank 0 "contiguous", rank 1 "zigzag"; partition: rank 0 '), (r, msg)
    for r in range(2):
        msgs = results[r]["w2_l2n_ag"]["bad"]
        assert not [m for m in msgs if m.startswith(("NO ERROR", "COLLECTIVE"))], msgs
        assert len(msgs) == 6, msgs
        assert msgs[0].endswith("partition: made for world_size 3, but the process group has "
                                "2 ranks"), msgs[0]
        assert f"ctx: made for rank {1 - r}, but this process is rank {r}" in msgs[1], msgs[1]
        assert "q: holds" in msgs[2] and "q: expected dtype" in msgs[3], msgs
        assert f"ctx: made for rank {1 - r}" in msgs[4] and "do: expected shape" in msgs[5], msgs


def test_dist_world_size_3(tmp_path):
    """A document over every rank (middle fragments; zigzag revisits a rank), and the
    ring on chunk-aligned cuts with an empty rank: the single-rank bits exactly."""
    _check(_spawn(tmp_path, 3, W3), W3)


def test_dist_world_size_4(tmp_path):
    _check(_spawn(tmp_path, 4, W4), W4)


@pytest.mark.parametrize("name", sorted(worker.CASES))
def test_cases_are_what_they_claim(name):
    """The partitions exercise what the case names say (host metadata only)."""
    from cake_core.kcp import build_context

    case = worker.CASES[name]
    W = case[0]
    p = worker.partition_of(case)
    ctxs = [build_context(p, None, r, "cpu", exchange=case[3], check_group=False)
            for r in range(W)]
    assert p.world_size == W
    assert any(c.crosses for c in ctxs) == (name != "w2_empty_ag")
    if "empty" in name or name == "w3_aligned_ring":
        assert any(c.is_empty for c in ctxs)
    if name.startswith(("w2_contig", "w3_empty")):
        assert any(f.length == 1 and f.has_next for c in ctxs for f in c.fragments)
    if name.startswith(("w3", "w4")) and "aligned" not in case[7] and "empty" not in name:
        assert any(f.has_prev and f.has_next for c in ctxs for f in c.fragments)
    if name.startswith(("w3_zigzag", "w4_zigzag")):  # a document comes back to a rank
        assert any(len({r for r, _ in p.doc_chain(d)}) < len(p.doc_chain(d))
                   for d in range(p.num_docs))
    if "aligned" in case[7]:
        assert all(f.doc_offset % 64 == 0 for c in ctxs for f in c.fragments)
