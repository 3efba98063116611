"""Mode refusals both ways with the real objects of both packages, the plan's mode and
serialisation, the deterministic-algorithms alert, the low-level API, torch.compile and
the name rules."""

import dataclasses
import warnings

import cake_core.mode
import cake_dense_projection_det_gemm as det
import cake_dense_projection_nondet_gemm as nd
import pytest
import torch
from cake_core import Mode
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_dense_projection_nondet_gemm.plan import from_det_plan

DEV = default_device()
F32 = torch.float32


def _xw(M=600, N=12, K=20):
    return randn((M, K), F32, DEV, seed=1), randn((N, K), F32, DEV, seed=2)


def _split(make, M=600, N=12, K=20):
    """A plan whose wgrad splits (the workspace then holds partial planes)."""
    return dataclasses.replace(make(M, N, K, F32, DEV), wgrad_splits=3)


def test_det_entries_refuse_nondet_objects():
    x, w = _xw()
    ndp = _split(nd.make_nondet_plan)
    with pytest.raises(ValueError, match="plan: got DenseProjectionNondetPlan with mode=nondet"):
        det.dense_projection_det(x, w, plan=ndp)
    ws = nd.DenseProjectionNondetWorkspace.for_plan(ndp, DEV)
    with pytest.raises(ValueError, match="workspace: got DenseProjectionNondetWorkspace"):
        det.dense_projection_det(x, w, plan=_split(det.make_plan), workspace=ws)
    y, saved = nd.dense_projection_nondet_fwd(x, w, plan=ndp)
    with pytest.raises(ValueError, match="saved: got DenseProjectionNondetSavedSet"):
        det.dense_projection_det_bwd(torch.ones_like(y), saved)
    with pytest.raises(ValueError, match="plan: expected DenseProjectionDetPlan with mode=det"):
        det.DenseProjectionDetWorkspace.for_plan(ndp, DEV)


def test_nondet_entries_refuse_det_objects():
    x, w = _xw()
    dp = _split(det.make_plan)
    with pytest.raises(ValueError, match="plan: got DenseProjectionDetPlan"):
        nd.dense_projection_nondet(x, w, plan=dp)
    ws = det.DenseProjectionDetWorkspace.for_plan(dp, DEV)
    with pytest.raises(ValueError, match="workspace: got DenseProjectionDetWorkspace"):
        nd.dense_projection_nondet(x, w, plan=_split(nd.make_nondet_plan), workspace=ws)
    y, saved = det.dense_projection_det_fwd(x, w, plan=dp)
    with pytest.raises(ValueError, match="saved: got DenseProjectionDetSavedSet"):
        nd.dense_projection_nondet_bwd(torch.ones_like(y), saved)
    with pytest.raises(ValueError, match="plan: expected DenseProjectionNondetPlan"):
        nd.DenseProjectionNondetWorkspace.for_plan(dp, DEV)


def test_plan_mode_rule_and_serialisation():
    p = nd.make_nondet_plan(600, 12, 20, F32, DEV)
    d = det.make_plan(600, 12, 20, F32, DEV)
    assert p.mode == Mode.NONDET and type(p).family == "cake-dense-projection-nondet-gemm"
    assert all(getattr(p, f.name) == getattr(d, f.name)
               for f in dataclasses.fields(d) if f.name != "mode")
    assert p.cublas_wgrad == 0  # the CPU rule: the det kernels
    # where the det rule routes forward and dgrad to cuBLAS (CUDA, bf16 / fp16), the wgrad
    # goes there too, with no split (no workspace)
    routed = from_det_plan(dataclasses.replace(d, cublas_fwd_dgrad=1, wgrad_splits=4))
    assert (routed.cublas_wgrad, routed.wgrad_splits) == (1, 1)
    assert nd.workspace_bytes_nondet(routed) == 0
    with pytest.raises(ValueError, match="cublas_wgrad"):
        dataclasses.replace(p, cublas_wgrad=2)
    assert p.to_dict()["version"] == 1
    assert nd.DenseProjectionNondetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="mode must be nondet"):
        dataclasses.replace(p, mode=Mode.DET)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(d, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="wgrad_splits"):
        dataclasses.replace(p, wgrad_splits=0)


def test_low_level_matches_autograd_with_workspace():
    x, w = _xw()
    b = randn((12,), F32, DEV, seed=3)
    plan = _split(nd.make_nondet_plan)
    ws = nd.DenseProjectionNondetWorkspace.for_plan(plan, DEV)
    y, saved = nd.dense_projection_nondet_fwd(x, w, b, plan=plan)
    dy = randn(tuple(y.shape), F32, DEV, seed=4)
    g = nd.dense_projection_nondet_bwd(dy, saved, workspace=ws)
    assert isinstance(g, nd.DenseProjectionNondetGrads)
    xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
    y2 = nd.dense_projection_nondet(xx, ww, bb, plan=plan, workspace=ws)
    y2.backward(dy)
    for a, c in ((y, y2.detach()), (g.dx, xx.grad), (g.dweight, ww.grad), (g.dbias, bb.grad)):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_deterministic_algorithms_alert():
    x, w = _xw(M=8)
    xx = x.clone().requires_grad_()
    was, was_warn = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(True)
        y = nd.dense_projection_nondet(xx, w)  # the forward is not refused
        with pytest.raises(RuntimeError, match="cake_dense_projection_det_gemm"):
            y.sum().backward()
        y, saved = nd.dense_projection_nondet_fwd(x, w)
        with pytest.raises(RuntimeError, match="dense_projection_det"):
            nd.dense_projection_nondet_bwd(torch.ones_like(y), saved)
        torch.use_deterministic_algorithms(True, warn_only=True)
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            nd.dense_projection_nondet(xx, w).sum().backward()
            nd.dense_projection_nondet(xx, w).sum().backward()
        assert sum("cake_dense_projection_det_gemm" in str(r.message) for r in rec) == 1
        assert xx.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)
        cake_core.mode._ALERTED.clear()


def test_torch_compile_runs_the_nondet_ops():
    from cake_core.testing import assert_compiles_to_op, leaf_grads

    x, w = _xw(M=24)

    def step(x, w):
        y = nd.dense_projection_nondet(x, w)
        return y.square().sum(), y

    compiled = assert_compiles_to_op(step, [x, w], [], ["y", "dx", "dweight"],
                                     backend="aot_eager",
                                     op="cake_dense_projection_nondet_gemm.fwd")
    try:  # the compiled backward's op alerts at run time
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="dense_projection_det"):
            leaf_grads(compiled, [x, w])
    finally:
        torch.use_deterministic_algorithms(False)


def test_nondet_linear_is_the_det_linear_on_nondet_entry():
    torch.manual_seed(0)
    m = nd.LinearNondet(20, 12, device=DEV)
    torch.manual_seed(0)
    ref = det.Linear(20, 12, device=DEV)
    assert m.state_dict().keys() == ref.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(),
                                                 ref.state_dict().values(), strict=True))
    x = randn((5, 20), F32, DEV, seed=6)
    torch.testing.assert_close(m(x), ref(x), rtol=0, atol=0)
    cake_core.mode._ALERTED.clear()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="dense_projection_det"):
            m(x).sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)


def test_name_rules():
    """Every public name of this package carries ``nondet``; the det package's none."""
    for name in nd.__all__:
        assert name == "__version__" or "nondet" in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name
    from cake_core.names import by_import

    e = by_import("cake_dense_projection_nondet_gemm")
    assert (e.mode, e.family) == ("nondet", by_import("cake_dense_projection_det_gemm").family)


def test_manifest_and_lazy_import():
    from cake_core.build import validate_manifest
    from cake_core.testing import assert_imports_without_triton
    from cake_dense_projection_nondet_gemm import cake_build

    assert validate_manifest(cake_build.manifest()) == []
    assert cake_build.FAMILY["mode"] == "nondet"
    assert_imports_without_triton("cake_dense_projection_nondet_gemm",
                                  "cake_dense_projection_nondet_gemm.cake_build")
