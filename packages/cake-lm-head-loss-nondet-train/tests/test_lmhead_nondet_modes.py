"""Mode refusals both ways with the real objects of both packages, the plan's mode and
rule, the deterministic-algorithms alert, the module, and the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_lm_head_loss_det_train as det
import cake_lm_head_loss_det_train.api as det_api
import cake_lm_head_loss_nondet_train as nd
import pytest
import torch
from _lmhead_nd_cases import DEV, make
from cake_core import Mode
from cake_core.testing import no_kernel_launches

H, V = 16, 40


@pytest.fixture
def data():
    return make((12,), H, V, seed=1)


def test_det_entries_refuse_nondet_objects(data):
    hidden, weight, _, labels = data
    plan = nd.make_nondet_plan(H, V, torch.float32, DEV)
    with pytest.raises(ValueError, match="plan: got LMHeadLossNondetPlan with mode=nondet"):
        det.lm_head_loss_det(hidden, weight, labels, plan=plan)
    ws = nd.LMHeadLossNondetWorkspace.for_plan(plan, DEV, torch.float32)
    with pytest.raises(ValueError, match="workspace: got LMHeadLossNondetWorkspace"):
        det.lm_head_loss_det(hidden, weight, labels, workspace=ws)
    (loss, _), saved = nd.lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels)
    one = torch.ones_like(loss)
    with pytest.raises(ValueError, match="saved: got LMHeadLossNondetSavedSet.*mode=det"):
        det.lm_head_loss_det_bwd(one, saved)
    _, dsaved = det.lm_head_loss_det_fwd(hidden.detach(), weight.detach(), labels)
    _, rsaved = det.lm_head_loss_det_fwd(hidden.detach(), weight.detach(), labels,
                                         reduction="none")  # no forward gradients: any plan
    with pytest.raises(ValueError, match="plan: got LMHeadLossNondetPlan"):
        det.lm_head_loss_det_bwd(torch.ones(12, device=DEV), rsaved,
                                 plan=nd.make_nondet_plan(H, V, torch.float32, DEV,
                                                          reduction="none"))
    with pytest.raises(ValueError, match="workspace: got LMHeadLossNondetWorkspace"):
        det.lm_head_loss_det_bwd(one, dsaved, workspace=ws)
    with pytest.raises(ValueError, match="plan: got LMHeadLossNondetPlan"):
        det.LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.float32)


def test_nondet_entries_refuse_det_objects(data):
    hidden, weight, _, labels = data
    plan = det.make_plan(H, V, torch.float32, DEV)
    with pytest.raises(ValueError, match="plan: got LMHeadLossDetPlan"):
        nd.lm_head_loss_nondet(hidden, weight, labels, plan=plan)
    ws = det.LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.float32)
    with pytest.raises(ValueError, match="workspace: got LMHeadLossDetWorkspace"):
        nd.lm_head_loss_nondet(hidden, weight, labels, workspace=ws)
    (loss, _), dsaved = det.lm_head_loss_det_fwd(hidden.detach(), weight.detach(), labels)
    one = torch.ones_like(loss)
    with pytest.raises(ValueError, match="saved: got LMHeadLossDetSavedSet.*mode=nondet"):
        nd.lm_head_loss_nondet_bwd(one, dsaved)
    _, saved = nd.lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels)
    _, rsaved = nd.lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels,
                                           reduction="none")  # no forward gradients
    with pytest.raises(ValueError, match="plan: got LMHeadLossDetPlan"):
        nd.lm_head_loss_nondet_bwd(torch.ones(12, device=DEV), rsaved,
                                   plan=det.make_plan(H, V, torch.float32, DEV,
                                                      reduction="none"))
    with pytest.raises(ValueError, match="workspace: got LMHeadLossDetWorkspace"):
        nd.lm_head_loss_nondet_bwd(one, saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: expected LMHeadLossNondetPlan"):
        nd.LMHeadLossNondetWorkspace.for_plan(plan, DEV, torch.float32)


def test_plan_mode_rule_and_serialisation():
    for dev in (DEV, torch.device("cuda")):
        for red in ("mean", "none"):
            p = nd.make_nondet_plan(4096, 32000, torch.bfloat16, dev, reduction=red)
            q = det.make_plan(4096, 32000, torch.bfloat16, dev, reduction=red)
            assert p.mode == Mode.NONDET and isinstance(p, nd.LMHeadLossNondetPlan)
            fields = lambda x: {f.name: getattr(x, f.name)  # noqa: E731
                                for f in dataclasses.fields(x) if f.name != "mode"}
            assert fields(p) == fields(q)
    d = p.to_dict()
    assert d["family"] == "cake-lm-head-loss-nondet-train" and d["version"] == 1
    assert d["mode"] == "nondet"
    assert nd.LMHeadLossNondetPlan.from_dict(d) == p
    with pytest.raises(ValueError, match="describes LMHeadLossDetPlan"):
        nd.LMHeadLossNondetPlan.from_dict(q.to_dict())
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):  # the det plan unchanged
        dataclasses.replace(q, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="reduction"):
        nd.make_nondet_plan(H, V, torch.float32, DEV, reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_deterministic_algorithms_alert(data, reduction):
    """Both gradient routes: "mean" (gradients kept from the forward, scaled in the
    backward) and "none" (recomputed in the backward)."""
    hidden, weight, _, labels = data
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()

    def run():
        loss = nd.lm_head_loss_nondet(hidden, weight, labels, reduction=reduction)
        loss.backward(torch.ones_like(loss))

    try:
        torch.use_deterministic_algorithms(True)
        loss = nd.lm_head_loss_nondet(hidden, weight, labels, reduction=reduction)
        (l2, _), saved = nd.lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels,
                                                     reduction=reduction)
        with no_kernel_launches(det_api, "ce_chunk_kernel", "matmul", "_scaled_rows"):
            with pytest.raises(RuntimeError, match="cake_lm_head_loss_det_train.lm_head_loss_det"):
                loss.backward(torch.ones_like(loss))
            with pytest.raises(RuntimeError, match="cake_lm_head_loss_nondet_train's backward"):
                nd.lm_head_loss_nondet_bwd(torch.ones_like(l2), saved)
        assert hidden.grad is None
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            run()
            run()
        assert sum("cake_lm_head_loss_det_train" in str(m.message) for m in w) == 1
        assert hidden.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_module_is_lmheadloss_on_this_package(data):
    hidden, _, _, labels = data
    head = nd.LMHeadLossNondet(H, V, device=DEV)
    ref = det.LMHeadLoss(H, V, device=DEV)
    ref.load_state_dict(head.state_dict())
    torch.testing.assert_close(head(hidden, labels), ref(hidden, labels))
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="lm_head_loss_det"):
            head(hidden, labels).backward()
    finally:
        torch.use_deterministic_algorithms(was)


def test_name_rules():
    """Every public name carries ``nondet`` (``__version__`` exempt); the det package's
    carry none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
        assert getattr(nd, name) is not None
    for name in det.__all__:
        assert "nondet" not in name.lower(), name


def test_imports_without_triton():
    from cake_core.testing import assert_imports_without_triton

    assert_imports_without_triton("cake_lm_head_loss_nondet_train",
                                  "cake_lm_head_loss_nondet_train.cake_build")
