"""Mode refusals both ways with the real objects of both packages, the deterministic-
algorithms alert (eager, low-level and compiled backward), the plan's mode and rule, and
the name rules."""

import dataclasses
import inspect
import warnings

import cake_core.mode
import cake_rmsnorm_silu_gate_det_train as det
import cake_rmsnorm_silu_gate_nondet_train as nd
import pytest
import torch
from _gate_norm_nd_cases import DEV, make
from cake_core import Mode

DET_ENTRY = "cake_rmsnorm_silu_gate_det_train.rmsnorm_silu_gate_det"


@pytest.fixture
def case():
    return make((6, 32), seed=7)


def test_det_entries_refuse_nondet_objects(case):
    x, z, w, dy = case
    plan = nd.make_nondet_plan(32, x.dtype, DEV)
    with pytest.raises(ValueError, match="plan: got RMSNormSiluGateNondetPlan"):
        det.rmsnorm_silu_gate_det(x, z, w, plan=plan)
    ws = nd.RMSNormSiluGateNondetWorkspace.for_plan(plan, DEV)
    with pytest.raises(ValueError, match="workspace: got RMSNormSiluGateNondetWorkspace"):
        det.rmsnorm_silu_gate_det(x, z, w, workspace=ws)
    _, saved = nd.rmsnorm_silu_gate_nondet_fwd(x, z, w)
    with pytest.raises(ValueError, match="saved: got RMSNormSiluGateNondetSavedSet.*mode=det"):
        det.rmsnorm_silu_gate_det_bwd(dy, saved)
    _, det_saved = det.rmsnorm_silu_gate_det_fwd(x, z, w)
    with pytest.raises(ValueError, match="plan: got RMSNormSiluGateNondetPlan"):
        det.rmsnorm_silu_gate_det_bwd(dy, det_saved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got RMSNormSiluGateNondetWorkspace"):
        det.rmsnorm_silu_gate_det_bwd(dy, det_saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: expected RMSNormSiluGateDetPlan"):
        det.RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)


def test_nondet_entries_refuse_det_objects(case):
    x, z, w, dy = case
    plan = det.make_plan(32, x.dtype, DEV)
    with pytest.raises(ValueError, match="plan: got RMSNormSiluGateDetPlan.*mode=nondet"):
        nd.rmsnorm_silu_gate_nondet(x, z, w, plan=plan)
    ws = det.RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)
    with pytest.raises(ValueError, match="workspace: got RMSNormSiluGateDetWorkspace"):
        nd.rmsnorm_silu_gate_nondet(x, z, w, workspace=ws)
    _, saved = det.rmsnorm_silu_gate_det_fwd(x, z, w)
    with pytest.raises(ValueError, match="saved: got RMSNormSiluGateDetSavedSet.*mode=nondet"):
        nd.rmsnorm_silu_gate_nondet_bwd(dy, saved)
    _, nd_saved = nd.rmsnorm_silu_gate_nondet_fwd(x, z, w)
    with pytest.raises(ValueError, match="plan: got RMSNormSiluGateDetPlan"):
        nd.rmsnorm_silu_gate_nondet_bwd(dy, nd_saved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got RMSNormSiluGateDetWorkspace"):
        nd.rmsnorm_silu_gate_nondet_bwd(dy, nd_saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: got RMSNormSiluGateDetPlan"):
        nd.RMSNormSiluGateNondetWorkspace.for_plan(plan, DEV)


def test_workspace_of_own_mode_runs(case):
    x, z, w, dy = case
    plan = nd.make_nondet_plan(32, x.dtype, DEV, group_size=8)
    ws = nd.RMSNormSiluGateNondetWorkspace.for_plan(plan, DEV)
    assert ws.mode == Mode.NONDET
    _, saved = nd.rmsnorm_silu_gate_nondet_fwd(x, z, w, group_size=8, plan=plan)
    g = nd.rmsnorm_silu_gate_nondet_bwd(dy, saved, workspace=ws)
    assert isinstance(g, nd.RMSNormSiluGateNondetGrads) and saved.mode == Mode.NONDET
    torch.testing.assert_close(g.dz, nd.rmsnorm_silu_gate_nondet_bwd(dy, saved).dz)


def test_plan_mode_rule_and_serialisation():
    p = nd.make_nondet_plan(4096, torch.bfloat16, DEV, group_size=1024)
    assert p.mode == Mode.NONDET and p.family == "cake-rmsnorm-silu-gate-nondet-train"
    assert nd.RMSNormSiluGateNondetPlan.format_version == 1
    assert nd.RMSNormSiluGateNondetPlan.from_dict(p.to_dict()) == p
    d = det.make_plan(4096, torch.bfloat16, DEV, group_size=1024)  # the det rule's fields
    skip = ("family", "plan", "mode", "version")
    assert {f: v for f, v in p.to_dict().items() if f not in skip} == \
        {f: v for f, v in d.to_dict().items() if f not in skip}
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="RMSNormSiluGateNondetPlan: block_g must be"):
        dataclasses.replace(p, block_g=512)
    with pytest.raises(ValueError, match="describes RMSNormSiluGateDetPlan"):
        nd.RMSNormSiluGateNondetPlan.from_dict(d.to_dict())


def _alert_all(x, z, w, dy):
    """Every backward path under the alert: eager autograd, the low-level backward, and
    the compiled graph's backward op."""
    xx = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match=DET_ENTRY):
        nd.rmsnorm_silu_gate_nondet(xx, z, w).backward(dy)  # the forward is not refused
    _, saved = nd.rmsnorm_silu_gate_nondet_fwd(x, z, w)
    with pytest.raises(RuntimeError, match=DET_ENTRY):
        nd.rmsnorm_silu_gate_nondet_bwd(dy, saved)
    fn = torch.compile(lambda a, b, c: nd.rmsnorm_silu_gate_nondet(a, b, c), fullgraph=True,
                       backend="aot_eager")
    y = fn(xx, z, w)
    with pytest.raises(RuntimeError, match=DET_ENTRY):
        y.backward(dy)


def test_deterministic_algorithms_alert(case):
    x, z, w, dy = case
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        _alert_all(x, z, w, dy)
        det_x = x.clone().requires_grad_()
        det.rmsnorm_silu_gate_det(det_x, z, w).backward(dy)  # the det package runs
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        xx = x.clone().requires_grad_()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            nd.rmsnorm_silu_gate_nondet(xx, z, w).backward(dy)
            nd.rmsnorm_silu_gate_nondet(xx, z, w).backward(dy)
            _, saved = nd.rmsnorm_silu_gate_nondet_fwd(x, z, w)
            nd.rmsnorm_silu_gate_nondet_bwd(dy, saved)
        assert sum(DET_ENTRY in str(m.message) for m in rec) == 1
        torch.testing.assert_close(xx.grad, 2 * det_x.grad)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_names_carry_nondet():
    """Every public name of this package carries ``nondet`` (``__version__`` aside); the
    det package exports none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
        getattr(nd, name)
    for name in det.__all__:
        assert "nondet" not in name.lower(), name


def test_no_deterministic_argument():
    for name in ("rmsnorm_silu_gate_nondet", "rmsnorm_silu_gate_nondet_fwd",
                 "rmsnorm_silu_gate_nondet_bwd", "make_nondet_plan"):
        assert "deterministic" not in inspect.signature(getattr(nd, name)).parameters
