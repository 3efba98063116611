"""Mode refusals both ways with the real objects: cake-gdn-det-train-kcp refuses this
package's saved set, workspace and plan, and this package refuses the det KCP package's
(and the single-rank packages') types, before any launch or collective; the
deterministic-algorithms alert; the name rules."""

import inspect
import warnings

import cake_core.mode
import cake_gdn_det_train_kcp as det_kcp
import cake_gdn_det_train_kcp.api as route
import cake_gdn_nondet_train_kcp as nd_kcp
import pytest
import torch
from _gdn_nd_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_core import Mode
from cake_gdn_det_train import make_plan
from cake_gdn_nondet_train import make_nondet_plan

_ROUTE = ("forward_allgather", "forward_ring", "backward_allgather", "backward_ring",
          "chunk_gdn_det_fwd", "chunk_gdn_det_bwd")


@pytest.fixture(scope="module")
def setup():
    p = nd_kcp.partition_nondet_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = nd_kcp.build_context_nondet_kcp(p, None, 0, DEV)
    local = shard(global_inputs(100, seed=21), p)
    _, nd_saved = nd_kcp.chunk_gdn_nondet_fwd_kcp(*local[:5], ctx)
    _, det_saved = det_kcp.chunk_gdn_det_fwd_kcp(*local[:5], ctx)
    dp, np_ = make_plan(16, 16, torch.float32, DEV), make_nondet_plan(16, 16, torch.float32, DEV)
    ws = {"det": det_kcp.GDNDetKCPWorkspace.for_context(dp, ctx, num_v_heads=1),
          "nondet": nd_kcp.GDNNondetKCPWorkspace.for_context(np_, ctx, num_v_heads=1)}
    return ctx, local, {"det": det_saved, "nondet": nd_saved}, ws, {"det": dp, "nondet": np_}


@pytest.fixture
def no_work(monkeypatch):
    """Any launch or collective of either package fails the test."""
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in _ROUTE:
        monkeypatch.setattr(route, name, boom)


def test_det_kcp_refuses_the_real_nondet_saved_set_workspace_and_plan(setup, no_work):
    ctx, local, saved, ws, plans = setup
    with pytest.raises(ValueError, match=r"^saved: got GDNNondetKCPSavedSet \(mode=nondet\), "
                                         r"expected GDNDetKCPSavedSet with mode=det"):
        det_kcp.chunk_gdn_det_bwd_kcp(local[5], saved["nondet"], ctx)
    with pytest.raises(ValueError, match=r"^saved: got GDNNondetSavedSet"):
        det_kcp.chunk_gdn_det_bwd_kcp(local[5], saved["nondet"].local[0], ctx)
    msg = r"^workspace: got GDNNondetKCPWorkspace \(mode=nondet\), expected GDNDetKCPWorkspace"
    with pytest.raises(ValueError, match=msg):
        det_kcp.chunk_gdn_det_bwd_kcp(local[5], saved["det"], ctx, workspace=ws["nondet"])
    with pytest.raises(ValueError, match=msg):
        det_kcp.chunk_gdn_det_fwd_kcp(*local[:5], ctx, workspace=ws["nondet"])
    for call in (lambda: det_kcp.chunk_gdn_det_fwd_kcp(*local[:5], ctx, plan=plans["nondet"]),
                 lambda: det_kcp.chunk_gated_delta_rule_det_kcp(*local[:5], ctx,
                                                                plan=plans["nondet"]),
                 lambda: det_kcp.chunk_gdn_det_bwd_kcp(local[5], saved["det"], ctx,
                                                       plan=plans["nondet"])):
        with pytest.raises(ValueError, match=r"^plan: got GDNNondetPlan with mode=nondet"):
            call()
    with pytest.raises(ValueError, match="^plan: expected GDNDetPlan, got GDNNondetPlan"):
        det_kcp.GDNDetKCPWorkspace.for_context(plans["nondet"], ctx, num_v_heads=1)


def test_nondet_kcp_refuses_det_objects(setup, no_work):
    ctx, local, saved, ws, plans = setup
    with pytest.raises(ValueError, match=r"^saved: got GDNDetKCPSavedSet \(mode=det\), "
                                         r"expected GDNNondetKCPSavedSet with mode=nondet"):
        nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["det"], ctx)
    with pytest.raises(ValueError, match=r"^saved: got GDNNondetSavedSet"):
        nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["nondet"].local[0], ctx)
    msg = r"^workspace: got GDNDetKCPWorkspace \(mode=det\), expected GDNNondetKCPWorkspace"
    with pytest.raises(ValueError, match=msg):
        nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["nondet"], ctx, workspace=ws["det"])
    with pytest.raises(ValueError, match=msg):
        nd_kcp.chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, workspace=ws["det"])
    with pytest.raises(ValueError, match=r"^workspace: got GDNNondetWorkspace"):
        nd_kcp.chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, workspace=ws["nondet"].local)
    for call in (lambda: nd_kcp.chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, plan=plans["det"]),
                 lambda: nd_kcp.chunk_gated_delta_rule_nondet_kcp(*local[:5], ctx,
                                                                  plan=plans["det"]),
                 lambda: nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["nondet"], ctx,
                                                         plan=plans["det"])):
        with pytest.raises(ValueError, match=r"^plan: got GDNDetPlan \(mode=det\), expected "
                                             r"GDNNondetPlan with mode=nondet"):
            call()
    with pytest.raises(ValueError, match="^plan: expected GDNNondetPlan, got GDNDetPlan"):
        nd_kcp.GDNNondetKCPWorkspace.for_context(plans["det"], ctx, num_v_heads=1)


def test_saved_sets_carry_their_mode_through_autograd(setup):
    ctx, local, saved, _, _ = setup
    s = saved["nondet"]
    assert s.mode == Mode.NONDET and all(x.mode == Mode.NONDET for x in s.local)
    again = nd_kcp.GDNNondetKCPSavedSet.from_tensors(Mode.NONDET, s.tensors(), s.meta)
    assert [type(x).__name__ for x in again.local] == ["GDNNondetSavedSet"] * len(s.local)
    assert all(x.mode == Mode.NONDET for x in again.local)


@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cake_core.mode._ALERTED.clear()
    yield
    torch.use_deterministic_algorithms(was, warn_only=was_warn)
    cake_core.mode._ALERTED.clear()


def test_alert_before_any_launch_or_collective(setup, deterministic, monkeypatch):
    ctx, local, saved, _, _ = setup
    leaves = [t.clone().requires_grad_() for t in local[:5]]
    torch.use_deterministic_algorithms(True)
    o = nd_kcp.chunk_gated_delta_rule_nondet_kcp(*leaves, ctx)  # the forward runs
    for name in _ROUTE:
        monkeypatch.setattr(route, name, lambda *a, **k: pytest.fail("work started"))
    for call in (lambda: o.backward(local[5]),
                 lambda: nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["nondet"], ctx)):
        with pytest.raises(RuntimeError,
                           match="cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp"):
            call()


def test_alert_warn_only_warns_once_then_runs(setup, deterministic):
    ctx, local, saved, _, _ = setup
    leaves = [t.clone().requires_grad_() for t in local[:5]]
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nd_kcp.chunk_gated_delta_rule_nondet_kcp(*leaves, ctx).backward(local[5])
        gr = nd_kcp.chunk_gdn_nondet_bwd_kcp(local[5], saved["nondet"], ctx)
    msgs = [str(x.message) for x in w if "not deterministic" in str(x.message)]
    assert len(msgs) == 1 and "chunk_gated_delta_rule_det_kcp" in msgs[0], msgs
    assert torch.equal(leaves[0].grad, gr.dq)


def test_public_names_carry_nondet_and_det_kcp_exports_none():
    for name in nd_kcp.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    det_names = set(det_kcp.__all__)
    for name in det_names:
        assert "nondet" not in name.lower(), name
    # every det KCP name has its nondet mirror
    for name in det_names - {"__version__"}:
        mirror = name.replace("_det", "_nondet").replace("Det", "Nondet")
        if mirror == name:
            mirror = name + "_nondet"
        assert mirror in nd_kcp.__all__, name
    for name in ("chunk_gated_delta_rule_nondet_kcp", "chunk_gdn_nondet_fwd_kcp",
                 "chunk_gdn_nondet_bwd_kcp"):
        assert "deterministic" not in inspect.signature(getattr(nd_kcp, name)).parameters
