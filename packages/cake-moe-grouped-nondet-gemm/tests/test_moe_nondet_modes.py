"""Mode refusals both ways with the real objects of both packages (the GEMM and the
layer's plans), the plan's mode and serialisation, the deterministic-algorithms alert, the
low-level API, torch.compile and the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_moe_grouped_det_gemm as det
import cake_moe_grouped_nondet_gemm as nd
import pytest
import torch
from _moe_nd_cases import DEV, make
from cake_core import Mode

F32 = torch.float32


def _split(make_plan, M=40, E=3, N=20, K=24):
    """A plan whose wgrad splits (the workspace then holds partial planes)."""
    return dataclasses.replace(make_plan(M, E, N, K, F32, DEV), wgrad_splits=2)


def _case():
    return make([10, 0, 30], dtype=F32)


def test_det_entries_refuse_nondet_objects():
    x, w, offs, dy = _case()
    ndp = _split(nd.make_nondet_plan)
    with pytest.raises(ValueError, match="plan: got MoEGroupedNondetPlan with mode=nondet"):
        det.moe_grouped_det_gemm(x, w, offs, plan=ndp)
    ws = nd.MoEGroupedNondetWorkspace.for_plan(ndp, DEV)
    with pytest.raises(ValueError, match="workspace: got MoEGroupedNondetWorkspace"):
        det.moe_grouped_det_gemm(x, w, offs, plan=_split(det.make_plan), workspace=ws)
    _, saved = nd.moe_grouped_nondet_gemm_fwd(x, w, offs, plan=ndp)
    with pytest.raises(ValueError, match="saved: got MoEGroupedNondetSavedSet"):
        det.moe_grouped_det_gemm_bwd(dy, saved)
    with pytest.raises(ValueError, match="plan: expected MoEGroupedDetPlan with mode=det"):
        det.MoEGroupedDetWorkspace.for_plan(ndp, DEV)
    plans = nd.make_nondet_moe_plans(6, 16, 12, 4, 2, F32, DEV)
    with pytest.raises(ValueError, match="plans: expected MoEFeedForwardPlans"):
        det.MoEFeedForward(16, 12, 4, 2, device=DEV)(torch.ones(6, 16, device=DEV),
                                                     plans=plans)
    with pytest.raises(ValueError, match="plan: got MoEGroupedNondetPlan"):
        det.moe_feed_forward_det(torch.ones(6, 16, device=DEV), *_layer_weights(), 2,
                                 plans=det.MoEFeedForwardPlans(*plans))


def _layer_weights(E=4, d=16, f=12):
    return (torch.ones(E, d, device=DEV), torch.ones(E, 2 * f, d, device=DEV),
            torch.ones(E, d, f, device=DEV))


def test_nondet_entries_refuse_det_objects():
    x, w, offs, dy = _case()
    dp = _split(det.make_plan)
    with pytest.raises(ValueError, match="plan: got MoEGroupedDetPlan"):
        nd.moe_grouped_nondet_gemm(x, w, offs, plan=dp)
    ws = det.MoEGroupedDetWorkspace.for_plan(dp, DEV)
    with pytest.raises(ValueError, match="workspace: got MoEGroupedDetWorkspace"):
        nd.moe_grouped_nondet_gemm(x, w, offs, plan=_split(nd.make_nondet_plan), workspace=ws)
    _, saved = det.moe_grouped_det_gemm_fwd(x, w, offs, plan=dp)
    with pytest.raises(ValueError, match="saved: got MoEGroupedDetSavedSet"):
        nd.moe_grouped_nondet_gemm_bwd(dy, saved)
    with pytest.raises(ValueError, match="plan: expected MoEGroupedNondetPlan"):
        nd.MoEGroupedNondetWorkspace.for_plan(dp, DEV)
    plans = det.make_moe_plans(6, 16, 12, 4, 2, F32, DEV)
    with pytest.raises(ValueError, match="plans: expected MoEFeedForwardNondetPlans"):
        nd.moe_feed_forward_nondet(torch.ones(6, 16, device=DEV), *_layer_weights(), 2,
                                   plans=plans)
    with pytest.raises(ValueError, match="plan: got MoEGroupedDetPlan"):
        nd.MoEFeedForwardNondet(16, 12, 4, 2, device=DEV)(
            torch.ones(6, 16, device=DEV), plans=nd.MoEFeedForwardNondetPlans(*plans))


def test_plan_mode_rule_and_serialisation():
    p = nd.make_nondet_plan(40, 3, 20, 24, F32, DEV)
    d = det.make_plan(40, 3, 20, 24, F32, DEV)
    assert p.mode == Mode.NONDET and type(p).family == "cake-moe-grouped-nondet-gemm"
    assert {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "mode"} \
        == {f.name: getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "mode"}
    assert p.to_dict()["version"] == 1
    assert nd.MoEGroupedNondetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(d, mode=Mode.NONDET)
    plans = nd.make_nondet_moe_plans(6, 16, 12, 4, 2, F32, DEV)
    assert all(isinstance(q, nd.MoEGroupedNondetPlan) for q in plans)


def test_low_level_matches_autograd_with_workspace():
    x, w, offs, dy = _case()
    plan = _split(nd.make_nondet_plan)
    ws = nd.MoEGroupedNondetWorkspace.for_plan(plan, DEV)
    y, saved = nd.moe_grouped_nondet_gemm_fwd(x, w, offs, plan=plan)
    g = nd.moe_grouped_nondet_gemm_bwd(dy, saved, workspace=ws)
    assert isinstance(g, nd.MoEGroupedNondetGrads)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y2 = nd.moe_grouped_nondet_gemm(xx, ww, offs, plan=plan, workspace=ws)
    y2.backward(dy)
    for a, c in ((y, y2.detach()), (g.dx, xx.grad), (g.dweight, ww.grad)):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_deterministic_algorithms_alert():
    x, w, offs, dy = make([3, 0, 5], dtype=F32)
    xx = x.clone().requires_grad_()
    was, was_warn = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        y = nd.moe_grouped_nondet_gemm(xx, w, offs)  # the forward is not refused
        with pytest.raises(RuntimeError, match="cake_moe_grouped_det_gemm"):
            y.backward(dy)
        _, saved = nd.moe_grouped_nondet_gemm_fwd(x, w, offs)
        with pytest.raises(RuntimeError, match="moe_grouped_det_gemm"):
            nd.moe_grouped_nondet_gemm_bwd(dy, saved)
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            nd.moe_grouped_nondet_gemm(xx, w, offs).backward(dy)
            nd.moe_grouped_nondet_gemm(xx, w, offs).backward(dy)
        assert sum("cake_moe_grouped_det_gemm" in str(r.message) for r in rec) == 1
        assert xx.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_torch_compile_runs_the_nondet_ops():
    from cake_core.testing import assert_compiles_to_op, leaf_grads

    x, w, offs, _ = make([3, 0, 5], dtype=F32)

    def step(x, w, offs):
        y = nd.moe_grouped_nondet_gemm(x, w, offs)
        return y.square().sum(), y

    compiled = assert_compiles_to_op(step, [x, w], [offs], ["y", "dx", "dweight"],
                                     backend="aot_eager", op="cake_moe_grouped_nondet_gemm.fwd")
    try:  # the compiled backward's op alerts at run time
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="moe_grouped_det_gemm"):
            leaf_grads(compiled, [x, w], offs)
    finally:
        torch.use_deterministic_algorithms(False)


def test_routing_helpers_and_module():
    logits = torch.tensor([[0.0, 1.0, 1.0], [2.0, 0.0, 0.0]], device=DEV)
    r = nd.moe_route_nondet(logits, 2)
    assert isinstance(r, nd.MoERoutingNondet)
    assert r.ids.tolist() == det.moe_route_det(logits, 2).ids.tolist() == [[1, 2], [0, 1]]
    wts, ids = nd.moe_topk_nondet(torch.softmax(logits, -1), 1)
    assert ids.tolist() == [[1], [0]]
    x = torch.arange(6.0, device=DEV).view(2, 3)
    xp = nd.moe_permute_nondet(x, r)
    assert torch.equal(nd.moe_unpermute_nondet(xp, r), det.moe_unpermute_det(xp, r))
    torch.manual_seed(0)
    m = nd.MoEFeedForwardNondet(16, 12, 4, 2, device=DEV)
    torch.manual_seed(0)
    ref = det.MoEFeedForward(16, 12, 4, 2, device=DEV)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 ref.state_dict().values(), strict=True))
    h = torch.randn(5, 16, device=DEV)
    assert torch.equal(m(h)[0], ref(h)[0])
    try:  # the layer's backward: its grouped GEMMs' alert, before any cake launch
        torch.use_deterministic_algorithms(True)
        y, aux = m(h)
        with pytest.raises(RuntimeError, match="moe_grouped_det_gemm"):
            (y.sum() + aux).backward()
    finally:
        torch.use_deterministic_algorithms(False)


def test_name_rules():
    """Every public name of this package carries ``nondet``; the det package's none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    from cake_core.names import by_import

    e = by_import("cake_moe_grouped_nondet_gemm")
    assert (e.mode, e.family) == ("nondet", by_import("cake_moe_grouped_det_gemm").family)


def test_manifest_and_lazy_import():
    from cake_core.build import validate_manifest
    from cake_core.testing import assert_imports_without_triton
    from cake_moe_grouped_nondet_gemm import cake_build

    assert validate_manifest(cake_build.manifest()) == []
    assert cake_build.FAMILY["mode"] == "nondet"
    assert_imports_without_triton("cake_moe_grouped_nondet_gemm",
                                  "cake_moe_grouped_nondet_gemm.cake_build")
