"""Mode refusals both ways with the real objects of both packages, the plan's mode and
rule, the deterministic-algorithms alert, the module, and the name rules."""

import dataclasses
import warnings

import cake_causal_conv1d_det_train as det
import cake_causal_conv1d_det_train.api as det_api
import cake_causal_conv1d_nondet_train as nd
import cake_core.mode
import pytest
import torch
from _conv_nd_cases import DEV, make_inputs
from cake_core import Mode
from cake_core.testing import no_kernel_launches

D, W = 24, 4
CU = (0, 0, 1, 3, 21)  # an empty and a one-token document


@pytest.fixture
def inp():
    return make_inputs(1, CU[-1], D, W, cu=CU, seed=7)


def _kw(inp):
    return dict(activation="silu", cu_seqlens=inp.cu, initial_state=inp.h0)


def test_det_entries_refuse_nondet_objects(inp):
    plan = nd.make_nondet_plan(D, W, torch.float32, DEV, varlen=True)
    with pytest.raises(ValueError, match="plan: got CausalConv1dNondetPlan with mode=nondet"):
        det.causal_conv1d_det(inp.x, inp.weight, inp.bias, plan=plan, **_kw(inp))
    ws = nd.CausalConv1dNondetWorkspace.for_plan(plan, DEV, max_tokens=21, max_seqs=4)
    with pytest.raises(ValueError, match="workspace: got CausalConv1dNondetWorkspace"):
        det.causal_conv1d_det(inp.x, inp.weight, inp.bias, workspace=ws, **_kw(inp))
    y, _, saved = nd.causal_conv1d_nondet_fwd(inp.x, inp.weight, inp.bias, **_kw(inp))
    with pytest.raises(ValueError, match="saved: got CausalConv1dNondetSavedSet.*mode=det"):
        det.causal_conv1d_det_bwd(inp.dy, None, saved)
    _, _, dsaved = det.causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, **_kw(inp))
    with pytest.raises(ValueError, match="plan: got CausalConv1dNondetPlan"):
        det.causal_conv1d_det_bwd(inp.dy, None, dsaved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got CausalConv1dNondetWorkspace"):
        det.causal_conv1d_det_bwd(inp.dy, None, dsaved, workspace=ws)
    with pytest.raises(ValueError, match="plan: got CausalConv1dNondetPlan"):
        det.CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=21)


def test_nondet_entries_refuse_det_objects(inp):
    plan = det.make_plan(D, W, torch.float32, DEV, varlen=True)
    with pytest.raises(ValueError, match="plan: got CausalConv1dDetPlan"):
        nd.causal_conv1d_nondet(inp.x, inp.weight, inp.bias, plan=plan, **_kw(inp))
    ws = det.CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=21, max_seqs=4)
    with pytest.raises(ValueError, match="workspace: got CausalConv1dDetWorkspace"):
        nd.causal_conv1d_nondet(inp.x, inp.weight, inp.bias, workspace=ws, **_kw(inp))
    _, _, dsaved = det.causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, **_kw(inp))
    with pytest.raises(ValueError, match="saved: got CausalConv1dDetSavedSet.*mode=nondet"):
        nd.causal_conv1d_nondet_bwd(inp.dy, None, dsaved)
    _, _, saved = nd.causal_conv1d_nondet_fwd(inp.x, inp.weight, inp.bias, **_kw(inp))
    with pytest.raises(ValueError, match="plan: got CausalConv1dDetPlan"):
        nd.causal_conv1d_nondet_bwd(inp.dy, None, saved, plan=plan)
    with pytest.raises(ValueError, match="workspace: got CausalConv1dDetWorkspace"):
        nd.causal_conv1d_nondet_bwd(inp.dy, None, saved, workspace=ws)
    with pytest.raises(ValueError, match="plan: expected CausalConv1dNondetPlan"):
        nd.CausalConv1dNondetWorkspace.for_plan(plan, DEV, max_tokens=21)


def test_plan_mode_rule_and_serialisation():
    for varlen in (False, True):
        for dev in (DEV, torch.device("cuda")):
            p = nd.make_nondet_plan(D, W, torch.bfloat16, dev, varlen=varlen)
            q = det.make_plan(D, W, torch.bfloat16, dev, varlen=varlen)
            assert p.mode == Mode.NONDET and isinstance(p, nd.CausalConv1dNondetPlan)
            assert {**p.to_dict(), "mode": "det"} == {**q.to_dict(), "mode": "det",
                                                      "family": p.family, "plan": p.to_dict()[
                                                          "plan"], "version": 1}
    assert p.to_dict()["family"] == "cake-causal-conv1d-nondet-train"
    assert nd.CausalConv1dNondetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="describes CausalConv1dDetPlan"):
        nd.CausalConv1dNondetPlan.from_dict(q.to_dict())
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):  # the det plan unchanged
        dataclasses.replace(q, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="kernel_size"):
        nd.make_nondet_plan(D, 9, torch.float32, DEV)


def test_deterministic_algorithms_alert(inp):
    x = inp.x.detach().clone().requires_grad_()
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        y, _ = nd.causal_conv1d_nondet(x, inp.weight, inp.bias, **_kw(inp))  # forward runs
        _, _, saved = nd.causal_conv1d_nondet_fwd(inp.x, inp.weight, inp.bias, **_kw(inp))
        with no_kernel_launches(det_api, "_launch_bwd"):  # raised before any launch
            with pytest.raises(RuntimeError,
                               match="cake_causal_conv1d_det_train.causal_conv1d_det"):
                y.backward(inp.dy)
            with pytest.raises(RuntimeError,
                               match="cake_causal_conv1d_nondet_train's backward"):
                nd.causal_conv1d_nondet_bwd(inp.dy, None, saved)
        assert x.grad is None
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                nd.causal_conv1d_nondet(x, inp.weight, inp.bias, **_kw(inp))[0].backward(inp.dy)
            nd.causal_conv1d_nondet_bwd(inp.dy, None, saved)
        assert sum("cake_causal_conv1d_det_train" in str(m.message) for m in w) == 1
        assert x.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_module_is_shortconvolution_on_this_package():
    conv = nd.ShortConvolutionNondet(D, W, activation="silu", device=DEV)
    ref = det.ShortConvolution(D, W, activation="silu", device=DEV)
    ref.load_state_dict(conv.state_dict())
    x = make_inputs(2, 20, D, W, seed=1).x
    y, fs = conv(x, output_final_state=True)
    want, wfs = ref(x, output_final_state=True)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(fs, wfs)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="causal_conv1d_det"):
            conv(x.requires_grad_())[0].sum().backward()
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

    assert_imports_without_triton("cake_causal_conv1d_nondet_train",
                                  "cake_causal_conv1d_nondet_train.cake_build")
