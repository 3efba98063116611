"""Mode refusals both ways with the real objects of both packages, the plan's mode and
serialisation, the deterministic-algorithms alert (both backwards), the workspace check
before the backward, the module, torch.compile and the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_mhc_det_train as det
import cake_mhc_nondet_train as nd
import pytest
import torch
from _mhc_nd_cases import DEV, make
from cake_core import Mode

F32 = torch.float32


def _args(case):
    return case["X"], case["phi"], case["alpha"], case["bias"]


def test_det_entries_refuse_nondet_objects():
    case = make(5, 4, 16)
    ndp = nd.make_nondet_plan(4, 16, F32, DEV)
    with pytest.raises(ValueError, match="plan: got MHCNondetPlan with mode=nondet"):
        det.mhc_det_prepare(*_args(case), plan=ndp)
    ws = nd.MHCNondetWorkspace.for_plan(ndp, DEV)
    with pytest.raises(ValueError, match="workspace: got MHCNondetWorkspace"):
        det.mhc_det_prepare(*_args(case), workspace=ws)
    U, handle = nd.mhc_nondet_prepare(*_args(case))
    with pytest.raises(ValueError, match="handle: got MHCNondetSavedSet"):
        det.mhc_det_finish(case["X"], U, handle)
    with pytest.raises(ValueError, match="plan: expected MHCDetPlan with mode=det"):
        det.MHCDetWorkspace.for_plan(ndp, DEV)


def test_nondet_entries_refuse_det_objects():
    case = make(5, 4, 16)
    dp = det.make_plan(4, 16, F32, DEV)
    with pytest.raises(ValueError, match="plan: got MHCDetPlan"):
        nd.mhc_nondet_prepare(*_args(case), plan=dp)
    ws = det.MHCDetWorkspace.for_plan(dp, DEV)
    with pytest.raises(ValueError, match="workspace: got MHCDetWorkspace"):
        nd.mhc_nondet_prepare(*_args(case), workspace=ws)
    U, handle = det.mhc_det_prepare(*_args(case))
    with pytest.raises(ValueError, match="handle: got MHCDetSavedSet"):
        nd.mhc_nondet_finish(case["X"], U, handle)
    with pytest.raises(ValueError, match="plan: expected MHCNondetPlan"):
        nd.MHCNondetWorkspace.for_plan(dp, DEV)


def test_plan_mode_rule_and_serialisation():
    p = nd.make_nondet_plan(4, 16, F32, DEV)
    d = det.make_plan(4, 16, F32, DEV)
    assert p.mode == Mode.NONDET and type(p).family == "cake-mhc-nondet-train"
    assert {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "mode"} \
        == {f.name: getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "mode"}
    assert p.to_dict()["version"] == 1
    assert nd.MHCNondetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(d, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="n_streams must be one of"):
        dataclasses.replace(p, n_streams=3)


def test_deterministic_algorithms_alert():
    case = make(5, 4, 16)
    X = case["X"].clone().requires_grad_()
    was, was_warn = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        U, h = nd.mhc_nondet_prepare(X, *_args(case)[1:])  # the forward is not refused
        with pytest.raises(RuntimeError, match="cake_mhc_det_train.mhc_det_prepare"):
            nd.mhc_nondet_finish(X, torch.tanh(U), h).sum().backward()
        U, h = nd.mhc_nondet_prepare(X, *_args(case)[1:])
        with pytest.raises(RuntimeError, match="cake_mhc_det_train"):
            U.sum().backward()  # the prepare's backward alone
        assert X.grad is None
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            for _ in range(2):
                U, h = nd.mhc_nondet_prepare(X, *_args(case)[1:])
                nd.mhc_nondet_finish(X, torch.tanh(U), h).sum().backward()
        assert sum("cake_mhc_det_train" in str(r.message) for r in rec) == 1
        assert X.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_workspace_changed_before_backward_refused():
    case = make(5, 4, 16)
    plan = nd.make_nondet_plan(4, 16, F32, DEV)
    ws = nd.MHCNondetWorkspace.for_plan(plan, DEV)
    X = case["X"].clone().requires_grad_()
    U, h = nd.mhc_nondet_prepare(X, *_args(case)[1:], plan=plan, workspace=ws)
    ws.mode = Mode.DET
    with pytest.raises(ValueError, match="checked again in the backward.*mhc_nondet_prepare"):
        nd.mhc_nondet_finish(X, torch.tanh(U), h).sum().backward()
    ws.mode = Mode.NONDET
    U, h = nd.mhc_nondet_prepare(X, *_args(case)[1:], plan=plan, workspace=ws)
    nd.mhc_nondet_finish(X, torch.tanh(U), h).sum().backward()
    assert bool(torch.isfinite(X.grad).all())


def test_module_is_the_det_module_on_nondet_entries():
    torch.manual_seed(0)
    m = nd.HyperConnectionNondet(torch.nn.Linear(16, 16), hidden_size=16, n_streams=2)
    torch.manual_seed(0)
    ref = det.HyperConnection(torch.nn.Linear(16, 16), hidden_size=16, n_streams=2)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 ref.state_dict().values(), strict=True))
    X = det.expand_streams(torch.randn(3, 16), 2).to(DEV)
    m, ref = m.to(DEV), ref.to(DEV)
    assert torch.equal(m(X), ref(X))
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="mhc_det_prepare"):
            m(X).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)


def test_torch_compile_runs_the_nondet_ops():
    """One fullgraph frame whose traced Functions call this package's ops, the eager bits."""
    from cake_core.testing import assert_bitwise_equal_named, leaf_grads
    from torch._dynamo.testing import CompileCounterWithBackend

    case = make(6, 2, 16)

    def step(X, phi, alpha, bias):
        U, h = nd.mhc_nondet_prepare(X, phi, alpha, bias)
        Y = nd.mhc_nondet_finish(X, torch.tanh(U), h)
        return Y.square().sum(), Y

    torch._dynamo.reset()
    want = leaf_grads(step, list(_args(case)))
    cnt = CompileCounterWithBackend("aot_eager")
    got = leaf_grads(torch.compile(step, fullgraph=True, backend=cnt), list(_args(case)))
    assert_bitwise_equal_named(got, want, ["Y", "dX", "dphi", "dalpha", "dbias"])
    assert cnt.frame_count == 1
    code = cnt.graphs[0].print_readable(print_output=False)
    assert "cake_mhc_nondet_train.prepare_fwd" in code and "cake_mhc_det_train" not in code
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    try:  # the compiled backward's ops alert at run time
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="mhc_det_prepare"):
            leaf_grads(compiled, list(_args(case)))
    finally:
        torch.use_deterministic_algorithms(False)


def test_name_rules():
    """Every public name of this package carries ``nondet``; the det package's none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    from cake_core.names import by_import

    e = by_import("cake_mhc_nondet_train")
    assert (e.mode, e.family) == ("nondet", by_import("cake_mhc_det_train").family)


def test_manifest_and_lazy_import():
    from cake_core.build import validate_manifest
    from cake_core.testing import assert_imports_without_triton
    from cake_mhc_nondet_train import cake_build

    assert validate_manifest(cake_build.manifest()) == []
    assert cake_build.FAMILY["mode"] == "nondet"
    assert_imports_without_triton("cake_mhc_nondet_train", "cake_mhc_nondet_train.cake_build")
