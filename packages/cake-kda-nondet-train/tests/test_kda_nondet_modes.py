"""Mode refusals both ways with the real objects of both packages, the plan's mode and
rule, the deterministic-algorithms alert, and the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_kda_det_train as det
import cake_kda_nondet_train as nd
import pytest
import torch
from _kda_nd_cases import DEV, make
from cake_core import Mode


@pytest.fixture(scope="module")
def case():
    q, k, v, g, beta, *_ = make(1, 10, 1, 2, 16, 16, seed=7, h0=False)
    return q, k, v, g, beta, torch.ones_like(v)


def _plans(dtype=torch.float32):
    return det.make_plan(16, 16, dtype, DEV), nd.make_nondet_plan(16, 16, dtype, DEV)


def test_det_entries_refuse_nondet_objects(case):
    q, k, v, g, beta, do = case
    _, nplan = _plans()
    for fn in (det.chunk_kda_det, det.chunk_kda_det_fwd):
        with pytest.raises(ValueError, match="plan: got KDANondetPlan with mode=nondet, "
                                             "expected KDADetPlan with mode=det"):
            fn(q, k, v, g, beta, plan=nplan)
        ws = nd.KDANondetWorkspace.for_plan(nplan, DEV, num_v_heads=2, max_tokens=10)
        with pytest.raises(ValueError, match="workspace: got KDANondetWorkspace"):
            fn(q, k, v, g, beta, workspace=ws)
    _, _, saved = nd.chunk_kda_nondet_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="saved: got KDANondetSavedSet .*mode=det"):
        det.chunk_kda_det_bwd(do, None, saved)
    _, _, dsaved = det.chunk_kda_det_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="plan: got KDANondetPlan"):
        det.chunk_kda_det_bwd(do, None, dsaved, plan=nplan)
    with pytest.raises(ValueError, match="workspace: got KDANondetWorkspace"):
        det.chunk_kda_det_bwd(do, None, dsaved, workspace=ws)
    with pytest.raises(ValueError, match="plan: got KDANondetPlan"):
        det.KDADetWorkspace.for_plan(nplan, DEV, num_v_heads=2, max_tokens=10)


def test_nondet_entries_refuse_det_objects(case):
    q, k, v, g, beta, do = case
    dplan, _ = _plans()
    dws = det.KDADetWorkspace.for_plan(dplan, DEV, num_v_heads=2, max_tokens=10)
    for fn in (nd.chunk_kda_nondet, nd.chunk_kda_nondet_fwd):
        with pytest.raises(ValueError, match="plan: got KDADetPlan .*expected KDANondetPlan "
                                             "with mode=nondet"):
            fn(q, k, v, g, beta, plan=dplan)
        with pytest.raises(ValueError, match="workspace: got KDADetWorkspace"):
            fn(q, k, v, g, beta, workspace=dws)
    _, _, dsaved = det.chunk_kda_det_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="saved: got KDADetSavedSet .*mode=nondet"):
        nd.chunk_kda_nondet_bwd(do, None, dsaved)
    _, _, saved = nd.chunk_kda_nondet_fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match="plan: got KDADetPlan"):
        nd.chunk_kda_nondet_bwd(do, None, saved, plan=dplan)
    with pytest.raises(ValueError, match="workspace: got KDADetWorkspace"):
        nd.chunk_kda_nondet_bwd(do, None, saved, workspace=dws)
    with pytest.raises(ValueError, match="plan: got KDADetPlan"):
        nd.KDANondetWorkspace.for_plan(dplan, DEV, num_v_heads=2, max_tokens=10)


def test_saved_set_workspace_and_grads_types(case):
    q, k, v, g, beta, do = case
    _, nplan = _plans()
    ws = nd.KDANondetWorkspace.for_plan(nplan, DEV, num_v_heads=2, max_tokens=10)
    assert ws.mode == Mode.NONDET and set(ws.names) == {"w", "u", "v_new", "h", "aqk"}
    o, _, saved = nd.chunk_kda_nondet_fwd(q, k, v, g, beta, plan=nplan, workspace=ws)
    assert saved.mode == Mode.NONDET and saved.plan is nplan
    assert saved.tensor_names == det.KDADetSavedSet.tensor_names
    gr = nd.chunk_kda_nondet_bwd(do, None, saved, workspace=ws)
    assert type(gr) is nd.KDANondetGrads and gr._fields == det.KDADetGrads._fields
    o2, _ = nd.chunk_kda_nondet(q, k, v, g, beta, plan=nplan, workspace=ws)
    torch.testing.assert_close(o2, o)


def test_plan_mode_rule_and_serialisation():
    for dtype in (torch.float32, torch.bfloat16):
        for device in ("cpu", "cuda"):
            d = det.make_plan(64, 128, dtype, device)
            p = nd.make_nondet_plan(64, 128, dtype, device)
            assert p.mode == Mode.NONDET and type(p) is nd.KDANondetPlan
            # today's rule is the det package's: the same fields
            assert {n: x for n, x in p.to_dict().items() if n not in ("family", "plan",
                                                                        "mode")} == \
                {n: x for n, x in d.to_dict().items() if n not in ("family", "plan", "mode")}
    assert p.family == "cake-kda-nondet-train" and p.format_version == 1
    assert nd.KDANondetPlan.from_dict(p.to_dict()) == p
    assert p != d and p.key != d.key
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(d, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="block_k"):
        dataclasses.replace(p, block_k=24)
    with pytest.raises(ValueError, match="describes KDADetPlan"):
        nd.KDANondetPlan.from_dict(d.to_dict())
    with pytest.raises(ValueError, match="head_k_dim"):
        nd.make_nondet_plan(0, 16, torch.float32, DEV)


@pytest.fixture
def deterministic_algorithms():
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    cake_core.mode._ALERTED.clear()
    yield
    torch.use_deterministic_algorithms(was, warn_only=was_warn)
    cake_core.mode._ALERTED.clear()


def test_deterministic_algorithms_alert(case, deterministic_algorithms, monkeypatch):
    import cake_kda_det_train.api as det_api

    q, k, v, g, beta, do = case
    qq = q.detach().clone().requires_grad_()
    torch.use_deterministic_algorithms(True)
    o, _ = nd.chunk_kda_nondet(qq, k, v, g, beta)  # the forward is not refused
    _, _, saved = nd.chunk_kda_nondet_fwd(q, k, v, g, beta)
    real = det_api._launch_bwd

    def boom(*a, **kw):
        raise AssertionError("launched before the alert")

    monkeypatch.setattr(det_api, "_launch_bwd", boom)
    with pytest.raises(RuntimeError, match="cake_kda_det_train.chunk_kda_det"):
        o.backward(do)
    with pytest.raises(RuntimeError, match="cake_kda_det_train.chunk_kda_det"):
        nd.chunk_kda_nondet_bwd(do, None, saved)
    monkeypatch.setattr(det_api, "_launch_bwd", real)
    # the det package's backward is not refused
    dq = q.detach().clone().requires_grad_()
    det.chunk_kda_det(dq, k, v, g, beta)[0].backward(do)
    torch.use_deterministic_algorithms(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        nd.chunk_kda_nondet(qq, k, v, g, beta)[0].backward(do)
        nd.chunk_kda_nondet_bwd(do, None, saved)
        nd.chunk_kda_nondet(qq, k, v, g, beta)[0].backward(do)
    assert sum("cake_kda_det_train.chunk_kda_det" in str(x.message) for x in w) == 1
    assert qq.grad is not None
    torch.testing.assert_close(qq.grad, 2 * dq.grad)


def test_names_carry_nondet():
    """Every public name of this package carries ``nondet`` (``__version__`` aside); the det
    package exports none; no entry takes ``deterministic``."""
    import inspect

    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
        assert hasattr(nd, name), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    for fn in (nd.chunk_kda_nondet, nd.chunk_kda_nondet_fwd, nd.chunk_kda_nondet_bwd,
               nd.make_nondet_plan, nd.KDANondetWorkspace.for_plan):
        assert "deterministic" not in inspect.signature(fn).parameters
    with pytest.raises(TypeError, match="deterministic"):
        nd.chunk_kda_nondet(*[torch.zeros(1)] * 5, deterministic=True)
    # every det entry has its nondet counterpart (the reference and the layer stay in det;
    # the queries add _nondet)
    queries = {"is_supported", "saved_bytes", "workspace_bytes"}
    want = {n + "_nondet" if n in queries else
            n.replace("_det", "_nondet").replace("Det", "Nondet").replace(
                "make_plan", "make_nondet_plan") for n in det.__all__} - {
        "kda_recurrence_ref", "kda_gate_ref", "KimiDeltaAttention"}
    assert want == set(nd.__all__)
