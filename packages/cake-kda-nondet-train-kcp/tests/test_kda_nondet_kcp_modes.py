"""Mode refusals both ways with the real objects: cake-kda-det-train-kcp's entries refuse
this package's saved sets, workspaces and plans, and this package's entries refuse the det
KCP ones and the single-rank packages' types; the deterministic-algorithms alert; the name
rules. Every refusal comes before any launch or collective."""

import warnings

import cake_core.mode
import cake_kda_det_train_kcp as dk
import cake_kda_det_train_kcp.api as det_kcp_api
import cake_kda_nondet_train_kcp as nk
import pytest
import torch
from _kda_nd_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core import Mode
from cake_kda_det_train import make_plan
from cake_kda_nondet_train import make_nondet_plan

_WORK = ("forward_allgather", "forward_ring", "backward_allgather", "backward_ring",
         "sum_over_ranks")


@pytest.fixture(scope="module")
def setup():
    p = nk.partition_nondet_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = nk.build_context_nondet_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=21)
    local = shard(xs, p)
    _, nsaved = nk.chunk_kda_nondet_fwd_kcp(*local[:5], ctx, **kw)
    _, dsaved = dk.chunk_kda_det_fwd_kcp(*local[:5], ctx, **kw)
    return ctx, local, kw, nsaved, dsaved


@pytest.fixture
def no_work(monkeypatch):
    """Any launch or collective fails the test."""
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in _WORK + ("chunk_kda_det_fwd", "chunk_kda_det_bwd"):
        monkeypatch.setattr(det_kcp_api, name, boom)
    import cake_kda_det_train.api as det_api

    for name in ("_launch_fwd", "_launch_bwd"):
        monkeypatch.setattr(det_api, name, boom)


def _plans():
    return make_plan(16, 16, torch.float32, DEV), make_nondet_plan(16, 16, torch.float32, DEV)


def test_det_kcp_entries_refuse_nondet_objects(setup, no_work):
    ctx, local, kw, nsaved, dsaved = setup
    dplan, nplan = _plans()
    with pytest.raises(ValueError, match=r"^saved: got KDANondetKCPSavedSet \(mode=nondet\), "
                                         r"expected KDADetKCPSavedSet with mode=det"):
        dk.chunk_kda_det_bwd_kcp(local[5], nsaved, ctx)
    nws = nk.KDANondetKCPWorkspace.for_context(nplan, ctx, num_v_heads=1)
    assert nws.mode == Mode.NONDET and nws.local.mode == Mode.NONDET
    for call in (lambda **o: dk.chunk_kda_det_bwd_kcp(local[5], dsaved, ctx, **o),
                 lambda **o: dk.chunk_kda_det_fwd_kcp(*local[:5], ctx, **kw, **o),
                 lambda **o: dk.chunk_kda_det_kcp(*local[:5], ctx, **kw, **o)):
        with pytest.raises(ValueError, match=r"^workspace: got KDANondetKCPWorkspace"):
            call(workspace=nws)
        with pytest.raises(ValueError, match=r"^plan: got KDANondetPlan with mode=nondet"):
            call(plan=nplan)
    with pytest.raises(ValueError, match=r"^plan: got KDANondetPlan"):
        dk.KDADetKCPWorkspace.for_context(nplan, ctx, num_v_heads=1)


def test_nondet_kcp_entries_refuse_det_objects(setup, no_work):
    ctx, local, kw, nsaved, dsaved = setup
    dplan, nplan = _plans()
    for obj in (dsaved, dsaved.local[0], nsaved.local[0], None):
        with pytest.raises(ValueError, match=r"^saved: got .*expected KDANondetKCPSavedSet "
                                             r"with mode=nondet"):
            nk.chunk_kda_nondet_bwd_kcp(local[5], obj, ctx)
    dws = dk.KDADetKCPWorkspace.for_context(dplan, ctx, num_v_heads=1)
    for call in (lambda **o: nk.chunk_kda_nondet_bwd_kcp(local[5], nsaved, ctx, **o),
                 lambda **o: nk.chunk_kda_nondet_fwd_kcp(*local[:5], ctx, **kw, **o),
                 lambda **o: nk.chunk_kda_nondet_kcp(*local[:5], ctx, **kw, **o)):
        for ws in (dws, dws.local, nk.KDANondetKCPWorkspace.for_context(nplan, ctx,
                                                                        num_v_heads=1).local):
            with pytest.raises(ValueError, match=r"^workspace: got .*expected "
                                                 r"KDANondetKCPWorkspace with mode=nondet"):
                call(workspace=ws)
        with pytest.raises(ValueError, match=r"^plan: got KDADetPlan .*expected KDANondetPlan"):
            call(plan=dplan)
    with pytest.raises(ValueError, match=r"^plan: expected KDANondetPlan, got KDADetPlan"):
        nk.KDANondetKCPWorkspace.for_context(dplan, ctx, num_v_heads=1)


def test_saved_set_nesting_and_modes(setup):
    _, _, _, nsaved, _ = setup
    assert nsaved.mode == Mode.NONDET and len(nsaved.local) == len(nsaved.meta["groups"])
    assert all(s.mode == Mode.NONDET and type(s).__name__ == "KDANondetSavedSet"
               for s in nsaved.local)
    back = nk.KDANondetKCPSavedSet.from_tensors(Mode.NONDET, nsaved.tensors(), nsaved.meta)
    assert [s.mode for s in back.local] == [Mode.NONDET] * len(nsaved.local)
    assert all(a is b for a, b in zip(back.tensors(), nsaved.tensors(), strict=True))


@pytest.fixture
def deterministic_algorithms():
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cake_core.mode._ALERTED.clear()
    yield
    torch.use_deterministic_algorithms(was, warn_only=was_warn)
    cake_core.mode._ALERTED.clear()


def test_deterministic_algorithms_alert(setup, deterministic_algorithms, monkeypatch):
    ctx, local, kw, nsaved, _ = setup
    torch.use_deterministic_algorithms(True)
    leaves = [t.clone().requires_grad_() for t in local[:5]]
    o = nk.chunk_kda_nondet_kcp(*leaves, ctx, **kw)  # the forward is not refused
    real = {n: getattr(det_kcp_api, n) for n in _WORK}

    def boom(*a, **k):
        raise AssertionError("launched or exchanged before the alert")

    for name in _WORK:
        monkeypatch.setattr(det_kcp_api, name, boom)
    msg = "cake_kda_det_train_kcp.chunk_kda_det_kcp"
    with pytest.raises(RuntimeError, match=msg):
        o.backward(local[5])
    with pytest.raises(RuntimeError, match=msg):
        nk.chunk_kda_nondet_bwd_kcp(local[5], nsaved, ctx)
    for name, fn in real.items():
        monkeypatch.setattr(det_kcp_api, name, fn)
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nk.chunk_kda_nondet_kcp(*leaves, ctx, **kw).backward(local[5])
        gr = nk.chunk_kda_nondet_bwd_kcp(local[5], nsaved, ctx)
    alerts = [str(x.message) for x in w if "not deterministic" in str(x.message)]
    assert len(alerts) == 1 and msg in alerts[0], alerts  # the local calls add none
    torch.testing.assert_close(leaves[0].grad, gr.dq)


def test_names_carry_nondet():
    """Every public name carries ``nondet`` (``__version__`` aside) and mirrors one of
    cake-kda-det-train-kcp's; the det KCP package exports none; no ``deterministic``."""
    import inspect

    for name in nk.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
        assert hasattr(nk, name), name
    for name in dk.__all__:
        assert "nondet" not in name.lower(), name
    def nondet(n):  # the det name's nondet spelling; names without det gain a suffix
        m = n.replace("_det", "_nondet").replace("Det", "Nondet")
        return m if m != n or n == "__version__" else n + "_nondet"

    assert {nondet(n) for n in dk.__all__} == set(nk.__all__)
    for fn in (nk.chunk_kda_nondet_kcp, nk.chunk_kda_nondet_fwd_kcp, nk.chunk_kda_nondet_bwd_kcp,
               nk.partition_nondet_kcp, nk.build_context_nondet_kcp,
               nk.KDANondetKCPWorkspace.for_context):
        assert "deterministic" not in inspect.signature(fn).parameters
