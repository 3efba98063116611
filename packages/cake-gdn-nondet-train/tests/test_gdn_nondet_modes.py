"""Mode refusals both ways with the real objects of both packages, the deterministic-
algorithms alert (before any launch; ``warn_only``), the custom ops (eager and
torch.compile) and the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_gdn_det_train as det
import cake_gdn_det_train.api as det_api
import cake_gdn_nondet_train as nd
import pytest
import torch
from _gdn_nd_cases import DEV, make_inputs
from cake_core import Mode
from cake_core.testing import assert_compiles_to_op

BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"


@pytest.fixture(scope="module")
def case():
    return make_inputs(1, 20, 1, 2, 16, 16, seed=11, h0=True)


def _plans(q):
    return det.make_plan(16, 16, q.dtype, DEV), nd.make_nondet_plan(16, 16, q.dtype, DEV)


def _workspaces(q):
    dp, np_ = _plans(q)
    return (det.GDNDetWorkspace.for_plan(dp, DEV, num_v_heads=2, max_tokens=20),
            nd.GDNNondetWorkspace.for_plan(np_, DEV, num_v_heads=2, max_tokens=20))


def test_det_entries_refuse_nondet_objects(case):
    q, k, v, g, beta, h0 = case
    _, plan = _plans(q)
    _, ws = _workspaces(q)
    msg = "got GDNNondet.* with mode=nondet, expected GDNDet.* with mode=det"
    for call in (lambda **kw: det.chunk_gdn_det_fwd(q, k, v, g, beta, **kw),
                 lambda **kw: det.chunk_gated_delta_rule_det(q, k, v, g, beta, **kw)):
        with pytest.raises(ValueError, match="^plan: " + msg):
            call(plan=plan)
    with pytest.raises(ValueError, match="^workspace: " + msg):
        det.chunk_gdn_det_fwd(q, k, v, g, beta, workspace=ws)
    do = torch.randn_like(v)
    _, _, saved = nd.chunk_gdn_nondet_fwd(q, k, v, g, beta, initial_state=h0)
    with pytest.raises(ValueError, match="^saved: got GDNNondetSavedSet .*mode=det"):
        det.chunk_gdn_det_bwd(do, None, saved)
    _, _, det_saved = det.chunk_gdn_det_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="^plan: " + msg):
        det.chunk_gdn_det_bwd(do, None, det_saved, plan=plan)
    with pytest.raises(ValueError, match="^workspace: " + msg):
        det.chunk_gdn_det_bwd(do, None, det_saved, workspace=ws)
    with pytest.raises(ValueError, match="^plan: expected GDNDetPlan, got GDNNondetPlan"):
        det.GDNDetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=20)


def test_nondet_entries_refuse_det_objects(case):
    q, k, v, g, beta, h0 = case
    plan, _ = _plans(q)
    ws, _ = _workspaces(q)
    msg = "got GDNDet.* expected GDNNondet.* with mode=nondet"
    for call in (lambda **kw: nd.chunk_gdn_nondet_fwd(q, k, v, g, beta, **kw),
                 lambda **kw: nd.chunk_gated_delta_rule_nondet(q, k, v, g, beta, **kw)):
        with pytest.raises(ValueError, match="^plan: " + msg):
            call(plan=plan)
    with pytest.raises(ValueError, match="^workspace: " + msg):
        nd.chunk_gdn_nondet_fwd(q, k, v, g, beta, workspace=ws)
    do = torch.randn_like(v)
    _, _, saved = det.chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0)
    with pytest.raises(ValueError, match="^saved: got GDNDetSavedSet .*mode=nondet"):
        nd.chunk_gdn_nondet_bwd(do, None, saved)
    _, _, nd_saved = nd.chunk_gdn_nondet_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="^plan: " + msg):
        nd.chunk_gdn_nondet_bwd(do, None, nd_saved, plan=plan)
    with pytest.raises(ValueError, match="^workspace: " + msg):
        nd.chunk_gdn_nondet_bwd(do, None, nd_saved, workspace=ws)
    with pytest.raises(ValueError, match="^plan: expected GDNNondetPlan, got GDNDetPlan"):
        nd.GDNNondetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=20)


def test_plan_mode_fields_and_serialisation(case):
    q = case[0]
    dp, p = _plans(q)
    assert p.mode == Mode.NONDET and dp.mode == Mode.DET
    assert type(p) is nd.GDNNondetPlan and p.family == "cake-gdn-nondet-train"
    # the det rule's fields (plans by rule today), in the nondet class
    assert {**p.to_dict(), "family": 0, "plan": 0, "mode": 0} == \
        {**dp.to_dict(), "family": 0, "plan": 0, "mode": 0}
    assert p != dp and nd.GDNNondetPlan.from_dict(p.to_dict()) == p
    assert nd.make_nondet_plan(16, 16, q.dtype, DEV, state_programs=2) == p  # CPU: unchanged
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(dp, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="describes GDNDetPlan"):
        nd.GDNNondetPlan.from_dict(dp.to_dict())
    with pytest.raises(ValueError, match="head_k_dim"):
        nd.make_nondet_plan(0, 16, q.dtype, DEV)


def _no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a backward kernel was launched")

    monkeypatch.setattr(det_api, "_launch_bwd", boom)


@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cake_core.mode._ALERTED.clear()
    yield
    torch.use_deterministic_algorithms(was, warn_only=was_warn)
    cake_core.mode._ALERTED.clear()


def test_deterministic_algorithms_alert_raises_before_any_launch(case, deterministic,
                                                                monkeypatch):
    q, k, v, g, beta, h0 = case
    qq = q.detach().clone().requires_grad_()
    torch.use_deterministic_algorithms(True)
    o, _ = nd.chunk_gated_delta_rule_nondet(qq, k, v, g, beta)  # the forward runs
    _, _, saved = nd.chunk_gdn_nondet_fwd(q, k, v, g, beta)
    _no_launch(monkeypatch)
    with pytest.raises(RuntimeError, match="cake_gdn_det_train.chunk_gated_delta_rule_det"):
        o.sum().backward()
    with pytest.raises(RuntimeError, match="cake_gdn_det_train.chunk_gated_delta_rule_det"):
        nd.chunk_gdn_nondet_bwd(torch.ones_like(o), None, saved)
    # the det package is not alerted: its backward runs (here: up to the launch)
    _, _, det_saved = det.chunk_gdn_det_fwd(q, k, v, g, beta)
    with pytest.raises(AssertionError, match="launched"):
        det.chunk_gdn_det_bwd(torch.ones_like(o), None, det_saved)


def test_deterministic_algorithms_warn_only_warns_once_then_runs(case, deterministic):
    q, k, v, g, beta, h0 = case
    qq = q.detach().clone().requires_grad_()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nd.chunk_gated_delta_rule_nondet(qq, k, v, g, beta)[0].sum().backward()
        _, _, saved = nd.chunk_gdn_nondet_fwd(q, k, v, g, beta)
        gr = nd.chunk_gdn_nondet_bwd(torch.ones_like(v), None, saved)
    assert sum("chunk_gated_delta_rule_det" in str(x.message) for x in w) == 1
    assert qq.grad is not None and torch.equal(qq.grad, gr.dq)


def test_custom_ops_eager_and_compiled(case):
    q, k, v, g, beta, h0 = case
    assert hasattr(torch.ops.cake_gdn_nondet_train, "fwd")
    assert hasattr(torch.ops.cake_gdn_nondet_train, "bwd")

    def step(q, k, v, g, beta, h0):
        o, ht = nd.chunk_gated_delta_rule_nondet(q, k, v, g, beta, initial_state=h0,
                                                 output_final_state=True)
        return (o * o).sum() + (ht * ht).sum(), o, ht

    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v, g, beta, h0))
    assert_compiles_to_op(step, leaves, (), ("o", "final_state", "dq", "dk", "dv", "dg",
                                             "dbeta", "dinitial_state"),
                          backend=BACKEND, op="cake_gdn_nondet_train.fwd")


def test_public_names_carry_nondet_and_det_exports_none():
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    assert "gdn_reference" not in nd.__all__ and "GatedDeltaNet" not in nd.__all__
    import inspect

    for fn in (nd.chunk_gated_delta_rule_nondet, nd.chunk_gdn_nondet_fwd,
               nd.chunk_gdn_nondet_bwd, nd.make_nondet_plan):
        assert "deterministic" not in inspect.signature(fn).parameters, fn
