"""Mode refusals both ways with the real objects of both packages, the deterministic-
algorithms alert (eager, low-level and compiled backward), the plan's mode and rule, and
the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_rmsnorm_det_train as det
import cake_rmsnorm_nondet_train as nd
import pytest
import torch
from _rmsnorm_nd_cases import DEV, make
from cake_core import Mode


@pytest.fixture
def case():
    return make((6, 32), seed=7)


def test_det_entries_refuse_nondet_objects(case):
    x, w, dy = case
    plan = nd.make_nondet_plan(32, x.dtype, DEV)
    with pytest.raises(ValueError, match="plan: got RMSNormNondetPlan"):
        det.rmsnorm_det(x, w, plan=plan)
    ws = nd.RMSNormNondetWorkspace.for_plan(plan, DEV)
    with pytest.raises(ValueError, match="workspace: got RMSNormNondetWorkspace"):
        det.rmsnorm_det(x, w, workspace=ws)
    _, saved = nd.rmsnorm_nondet_fwd(x, w)
    with pytest.raises(ValueError, match="saved: got RMSNormNondetSavedSet.*mode=det"):
        det.rmsnorm_det_bwd(dy, None, saved)
    _, det_saved = det.rmsnorm_det_fwd(x, w)
    with pytest.raises(ValueError, match="plan: got RMSNormNondetPlan"):
        det.rmsnorm_det_bwd(dy, None, det_saved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got RMSNormNondetWorkspace"):
        det.rmsnorm_det_bwd(dy, None, det_saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: expected RMSNormDetPlan"):
        det.RMSNormDetWorkspace.for_plan(plan, DEV)


def test_nondet_entries_refuse_det_objects(case):
    x, w, dy = case
    plan = det.make_plan(32, x.dtype, DEV)
    with pytest.raises(ValueError, match="plan: got RMSNormDetPlan.*mode=nondet"):
        nd.rmsnorm_nondet(x, w, plan=plan)
    ws = det.RMSNormDetWorkspace.for_plan(plan, DEV)
    with pytest.raises(ValueError, match="workspace: got RMSNormDetWorkspace"):
        nd.rmsnorm_nondet(x, w, workspace=ws)
    _, saved = det.rmsnorm_det_fwd(x, w)
    with pytest.raises(ValueError, match="saved: got RMSNormDetSavedSet.*mode=nondet"):
        nd.rmsnorm_nondet_bwd(dy, None, saved)
    _, nd_saved = nd.rmsnorm_nondet_fwd(x, w)
    with pytest.raises(ValueError, match="plan: got RMSNormDetPlan"):
        nd.rmsnorm_nondet_bwd(dy, None, nd_saved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got RMSNormDetWorkspace"):
        nd.rmsnorm_nondet_bwd(dy, None, nd_saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: got RMSNormDetPlan"):
        nd.RMSNormNondetWorkspace.for_plan(plan, DEV)


def test_workspace_of_own_mode_runs(case):
    x, w, dy = case
    plan = nd.make_nondet_plan(32, x.dtype, DEV)
    ws = nd.RMSNormNondetWorkspace.for_plan(plan, DEV)
    assert ws.mode == Mode.NONDET
    _, saved = nd.rmsnorm_nondet_fwd(x, w, plan=plan)
    g = nd.rmsnorm_nondet_bwd(dy, None, saved, workspace=ws)
    assert isinstance(g, nd.RMSNormNondetGrads) and saved.mode == Mode.NONDET
    torch.testing.assert_close(g.dx, nd.rmsnorm_nondet_bwd(dy, None, saved).dx)


def test_plan_mode_rule_and_serialisation():
    p = nd.make_nondet_plan(4096, torch.bfloat16, DEV)
    assert p.mode == Mode.NONDET and p.family == "cake-rmsnorm-nondet-train"
    assert nd.RMSNormNondetPlan.format_version == 1
    assert nd.RMSNormNondetPlan.from_dict(p.to_dict()) == p
    d = det.make_plan(4096, torch.bfloat16, DEV)  # by rule: the det rule's fields today
    assert {f: v for f, v in p.to_dict().items() if f not in ("family", "plan", "mode")} == \
        {f: v for f, v in d.to_dict().items() if f not in ("family", "plan", "mode")}
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="RMSNormNondetPlan: block_h must be >= hidden_size"):
        dataclasses.replace(p, block_h=1024)
    with pytest.raises(ValueError, match="describes RMSNormDetPlan"):
        nd.RMSNormNondetPlan.from_dict(d.to_dict())


def _alert_all(x, w, dy, module=False):
    """Every backward path of the package under the alert: eager autograd, the low-level
    backward, and the compiled graph's backward op."""
    xx = x.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="cake_rmsnorm_det_train.rmsnorm_det"):
        nd.rmsnorm_nondet(xx, w).backward(dy)  # the forward is not refused
    _, saved = nd.rmsnorm_nondet_fwd(x, w)
    with pytest.raises(RuntimeError, match="cake_rmsnorm_det_train.rmsnorm_det"):
        nd.rmsnorm_nondet_bwd(dy, None, saved)
    fn = torch.compile(lambda a, b: nd.rmsnorm_nondet(a, b), fullgraph=True,
                       backend="aot_eager")
    y = fn(xx, w)
    with pytest.raises(RuntimeError, match="cake_rmsnorm_det_train.rmsnorm_det"):
        y.backward(dy)


def test_deterministic_algorithms_alert(case):
    x, w, dy = case
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        _alert_all(x, w, dy)
        det_x = x.clone().requires_grad_()
        det.rmsnorm_det(det_x, w).backward(dy)  # the det package is not refused
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        xx = x.clone().requires_grad_()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            nd.rmsnorm_nondet(xx, w).backward(dy)
            nd.rmsnorm_nondet(xx, w).backward(dy)
            _, saved = nd.rmsnorm_nondet_fwd(x, w)
            nd.rmsnorm_nondet_bwd(dy, None, saved)
        assert sum("cake_rmsnorm_det_train.rmsnorm_det" in str(m.message) for m in rec) == 1
        torch.testing.assert_close(xx.grad, 2 * det_x.grad)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_names_carry_nondet():
    """Every public name of this package carries ``nondet`` (``__version__`` aside); the
    det package exports none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    for name in nd.__all__:
        getattr(nd, name)  # every name resolves


def test_no_deterministic_argument():
    import inspect

    for name in ("rmsnorm_nondet", "rmsnorm_nondet_fwd", "rmsnorm_nondet_bwd",
                 "make_nondet_plan"):
        assert "deterministic" not in inspect.signature(getattr(nd, name)).parameters
