"""The module drop-in, plans, workspaces, torch.compile, manifest."""

import pytest
import torch
from cake_core.testing import assert_compile_same_bits, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import (
    RMSNorm,
    RMSNormDetPlan,
    RMSNormDetWorkspace,
    make_plan,
    rmsnorm_det,
)

DEV = default_device()


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("shape", [64, (4, 16)])
def test_module_matches_torch(eps, shape):
    torch.manual_seed(0)
    ref = torch.nn.RMSNorm(shape, eps=eps, device=DEV)
    with torch.no_grad():
        ref.weight.normal_()
    ours = RMSNorm(shape, eps=eps, device=DEV)
    ours.load_state_dict(ref.state_dict())
    ref.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight"]
    x = randn((3, 5, 64), torch.float32, DEV, seed=1)
    x = x.reshape(3, 5, *((64,) if shape == 64 else shape)).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, y2 = ours(x), ref(x2)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    y2.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)


def test_module_without_affine():
    m = RMSNorm(32, elementwise_affine=False, device=DEV)
    assert m.weight is None and list(m.state_dict()) == []
    x = randn((4, 32), torch.float32, DEV, seed=2)
    torch.testing.assert_close(m(x), torch.nn.functional.rms_norm(x, (32,)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="trailing dims"):
        m(randn((4, 31), torch.float32, DEV))


def test_torch_compile_fullgraph_same_values():
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), RMSNorm(64), torch.nn.Linear(64, 8))
    model = model.to(DEV)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if DEV.type == "cpu"
                             else "inductor")
    x = randn((10, 48), torch.float32, DEV, seed=3)
    y_eager = model(x)
    y_eager.square().sum().backward()
    g_eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    y_comp = compiled(x)
    y_comp.square().sum().backward()
    torch.testing.assert_close(y_comp, y_eager, rtol=1e-5, atol=1e-6)
    for a, p in zip(g_eager, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-6)


def test_plan_rules_and_roundtrip():
    p = make_plan(5120, torch.bfloat16, DEV)
    assert p.block_h == 8192 and p.hidden_size == 5120 and p.mode.value == "det"
    assert make_plan(5120, torch.bfloat16, DEV) == p  # rule, not timing: same answer
    assert RMSNormDetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="hidden_size"):
        make_plan(0, torch.float32, DEV)
    with pytest.raises(ValueError, match="power of two"):
        RMSNormDetPlan(hidden_size=8, block_h=8, block_m_fwd=3, num_warps_fwd=1,
                       block_m_bwd=1, num_warps_bwd=1, bwd_programs=2, reduce_block_p=2,
                       reduce_block_c=8)


def test_explicit_plan_and_workspace_reuse():
    H = 130
    plan = make_plan(H, torch.float32, DEV)
    ws = RMSNormDetWorkspace.for_plan(plan, DEV)
    assert ws.nbytes == plan.bwd_programs * H * 4
    for rows in (5, 50):  # one workspace serves any row count
        x = randn((rows, H), torch.float32, DEV, seed=rows).requires_grad_()
        w = randn((H,), torch.float32, DEV, seed=9).requires_grad_()
        rmsnorm_det(x, w, plan=plan, workspace=ws).sum().backward()
        x2 = x.detach().clone().requires_grad_()
        w2 = w.detach().clone().requires_grad_()
        rmsnorm_det(x2, w2).sum().backward()
        assert torch.equal(w.grad, w2.grad)


def test_manifest():
    from cake_core.build import validate_manifest
    from cake_rmsnorm_det_train.cake_build import manifest

    m = manifest()
    assert validate_manifest(m) == []
    assert m["name"] == "cake-rmsnorm-det-train"
    import importlib

    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])


def test_shared_workspace_and_accumulator_across_calls():
    """Two calls share one workspace and one accumulator (tied weights) before backward."""
    H = 48
    plan = make_plan(H, torch.float32, DEV)
    ws = RMSNormDetWorkspace.for_plan(plan, DEV)
    acc = torch.zeros(H, device=DEV)
    w = randn((H,), torch.float32, DEV, seed=1).requires_grad_()
    a = randn((7, H), torch.float32, DEV, seed=2).requires_grad_()
    b = randn((9, H), torch.float32, DEV, seed=3).requires_grad_()
    ya = rmsnorm_det(a, w, plan=plan, workspace=ws, dweight_accumulator=acc)
    yb = rmsnorm_det(b, w, plan=plan, workspace=ws, dweight_accumulator=acc)
    (ya.sum() + yb.sum()).backward()
    w2 = w.detach().clone().requires_grad_()
    (rmsnorm_det(a.detach(), w2).sum() + rmsnorm_det(b.detach(), w2).sum()).backward()
    torch.testing.assert_close(acc, w2.grad, rtol=1e-6, atol=1e-6)


def test_module_meta_init_dtype_mix_and_strides():
    with torch.device("meta"):
        m = RMSNorm(32, elementwise_affine=False)
    m.to_empty(device=DEV)
    m.reset_parameters()
    x = randn((4, 32), torch.float32, DEV, seed=4)
    torch.testing.assert_close(m(x), torch.nn.functional.rms_norm(x, (32,)))
    bf = RMSNorm(32, dtype=torch.bfloat16, device=DEV)  # module dtype != input dtype
    torch.testing.assert_close(bf(x), torch.nn.functional.rms_norm(x, (32,)))
    xt = randn((32, 4), torch.float32, DEV, seed=5).t()  # last dim not contiguous
    torch.testing.assert_close(RMSNorm(32, device=DEV)(xt),
                               torch.nn.functional.rms_norm(xt, (32,)))
    with pytest.raises(ValueError, match="normalized_shape"):
        RMSNorm(0)


def test_double_backward_refused_not_silent():
    x = randn((4, 32), torch.float32, DEV, seed=6).requires_grad_()
    w = randn((32,), torch.float32, DEV, seed=7).requires_grad_()
    (g,) = torch.autograd.grad(rmsnorm_det(x, w).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
        g.pow(2).sum().backward()


def test_plan_field_types():
    good = make_plan(32, torch.float32, DEV).to_dict()
    for field, bad in (("bwd_programs", 1.5), ("hidden_size", 32.0), ("num_warps_fwd", 0),
                       ("block_h", True)):
        with pytest.raises(ValueError, match=field):
            RMSNormDetPlan.from_dict({**good, field: bad})
    with pytest.raises(ValueError, match="hidden_size"):
        make_plan(True, torch.float32, DEV)
    with pytest.raises(ValueError, match="device"):
        make_plan(32, torch.float32, "nope")
    import numpy as np

    assert make_plan(np.int64(32), torch.float32, DEV) == make_plan(32, torch.float32, DEV)


def test_torch_compile_with_offset_same_values():
    """The custom op carries ``offset`` (fullgraph compile, forward and backward)."""
    torch._dynamo.reset()
    x = randn((10, 64), torch.float32, DEV, seed=5)
    w = randn((64,), torch.float32, DEV, seed=6, scale=0.1)
    assert_compile_same_bits(lambda x, w: rmsnorm_det(x, w, 1e-6, offset=1.0), [x, w],
                             backend="aot_eager" if DEV.type == "cpu" else "inductor")


def test_torch_compile_dynamic_with_a_traced_offset():
    """``dynamic=True`` traces a float argument: an offset passed as one reaches the kernels
    with its value (forward and backward, residual included), as eager."""
    torch._dynamo.reset()
    x = randn((6, 64), torch.float32, DEV, seed=7).requires_grad_()
    w = randn((64,), torch.float32, DEV, seed=8, scale=0.1).requires_grad_()
    r = randn((6, 64), torch.float32, DEV, seed=9)

    def f(x, w, offset):
        y, h = rmsnorm_det(x, w, 1e-6, offset=offset, residual=r)
        return y.square().sum() + h.sum()

    cf = torch.compile(f, fullgraph=True, dynamic=True,
                       backend="aot_eager" if DEV.type == "cpu" else "inductor")
    for offset in (1.0, -0.5):
        x.grad = w.grad = None
        f(x, w, offset).backward()
        want = (x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        cf(x, w, offset).backward()
        torch.testing.assert_close(x.grad, want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w.grad, want[1], rtol=1e-5, atol=1e-6)
