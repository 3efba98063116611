"""The TMA wgrad (plan field ``wgrad_tma``; the CUDA rule picks it on Hopper) under the
interpreter: autograd end to end vs float64, bitwise repeats, splits with main_grad,
refusals, plan format."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    DenseProjectionDetPlan,
    dense_projection_det,
    dense_projection_det_bwd,
    dense_projection_det_fwd,
    make_plan,
)
from cake_dense_projection_det_gemm.plan import wgrad_tma_problem

DEV = default_device()
M, N, K = 200, 96, 80


def _plan(dtype, tma, **over):
    # 64-wide wgrad tiles and 64-token steps: masked edge tiles (96 = 64 + 32, 80 = 64 + 16)
    # and a partial last token step (200 = 3 * 64 + 8)
    base = make_plan(M, N, K, dtype, DEV)
    return dataclasses.replace(base, wgrad_block_m=64, wgrad_block_n=64, wgrad_block_k=64,
                               wgrad_group_m=2, wgrad_tma=tma, **over)


def _run(dtype, plan, seed=0, bias=True, main_grad=None):
    x = randn((2, M // 2, K), dtype, DEV, seed=seed + 1).requires_grad_()
    w = randn((N, K), dtype, DEV, seed=seed + 2).requires_grad_()
    b = randn((N,), dtype, DEV, seed=seed + 3).requires_grad_() if bias else None
    dy = randn((2, M // 2, N), dtype, DEV, seed=seed + 4)
    y = dense_projection_det(x, w, b, plan=plan, main_grad=main_grad)
    y.backward(dy)
    return x, w, b, dy, y


@pytest.mark.parametrize("tma", [1, 2], ids=["tma", "tma-persistent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_wgrad_tma_autograd_reference_and_repeat(dtype, tma):
    plan = _plan(dtype, tma)
    x, w, b, dy, y = _run(dtype, plan)
    ref_dw = dy.double().reshape(M, N).t() @ x.detach().double().reshape(M, K)
    assert_close_to_reference(w.grad, ref_dw, dtype, "dweight")
    assert_close_to_reference(b.grad, dy.double().reshape(M, N).sum(0), dtype, "dbias")
    x2, w2, b2, _, _ = _run(dtype, plan)
    assert bitwise_equal(w.grad, w2.grad) and bitwise_equal(x.grad, x2.grad)
    assert bitwise_equal(b.grad, b2.grad)
    # the pointer wgrad agrees within rounding; dx and dbias do not change at all
    x0, w0, b0, _, _ = _run(dtype, _plan(dtype, 0))
    torch.testing.assert_close(w.grad.double(), w0.grad.double(), rtol=2e-2, atol=2e-2)
    assert bitwise_equal(x.grad, x0.grad) and bitwise_equal(b.grad, b0.grad)


@pytest.mark.parametrize("splits", [2, 3])
def test_wgrad_tma_splits_main_grad(splits):
    dtype = torch.bfloat16
    plan = _plan(dtype, 1, wgrad_splits=splits)
    start = randn((N, K), torch.float32, DEV, seed=50)
    mg = start.clone()
    x, w, _, dy, _ = _run(dtype, plan, seed=10, bias=False, main_grad=mg)
    assert w.grad is None
    ref = dy.double().reshape(M, N).t() @ x.detach().double().reshape(M, K)
    assert_close_to_reference(mg - start, ref, torch.float32, tol=1e-5)
    mg2 = start.clone()
    _run(dtype, plan, seed=10, bias=False, main_grad=mg2)
    assert bitwise_equal(mg, mg2)
    mg3 = start.clone()  # the persistent launch: same work items, same bits
    _run(dtype, dataclasses.replace(plan, wgrad_tma=2), seed=10, bias=False, main_grad=mg3)
    assert bitwise_equal(mg, mg3)


def test_wgrad_tma_strided_inputs_low_level():
    """Non-contiguous dy / x (a column slice, 16-byte misaligned start) are copied first."""
    dtype = torch.bfloat16
    plan = _plan(dtype, 1)
    xb = randn((M, K + 8), dtype, DEV, seed=60)
    x = xb[:, 3:K + 3]  # misaligned start: TMA cannot read it as is
    w = randn((N, K), dtype, DEV, seed=61)
    dy = randn((N, M), dtype, DEV, seed=62).t()  # column-major dy
    _, saved = dense_projection_det_fwd(x, w, plan=plan)
    g = dense_projection_det_bwd(dy, saved)
    assert_close_to_reference(g.dweight, dy.double().t() @ x.double(), dtype, "dweight")
    g2 = dense_projection_det_bwd(dy.contiguous(), saved)
    assert bitwise_equal(g.dweight, g2.dweight)
    # contiguous views at an unaligned start (2 bytes in): contiguous() would return them as
    # is and the TMA descriptor would refuse them; they are copied
    flat = torch.zeros(M * K + M * N + 2, dtype=dtype, device=DEV)
    xu = flat[1:1 + M * K].view(M, K)
    dyu = flat[2 + M * K:].view(M, N)
    xu.copy_(x)
    dyu.copy_(dy)
    assert xu.is_contiguous() and dyu.is_contiguous() and xu.data_ptr() % 16 != 0
    _, saved_u = dense_projection_det_fwd(xu, w, plan=plan)
    g3 = dense_projection_det_bwd(dyu, saved_u)
    assert bitwise_equal(g.dweight, g3.dweight)


def test_wgrad_tma_refusals_and_rule(monkeypatch):
    import cake_dense_projection_det_gemm.plan as plan_mod

    monkeypatch.setattr(plan_mod, "sm_count", lambda device: 132)  # an H200-sized rule
    cuda = torch.device("cuda")
    for cap in ((8, 0), (9, 0)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for m, n, k in ((4, 8, 16), (200, 96, 80), (16384, 4096, 4096), (4096, 128, 8192),
                            (64, 100, 64), (64, 64, 100)):
                if DEV == "cpu":
                    assert make_plan(m, n, k, dtype, DEV).wgrad_tma == 0  # the interpreter
                p = plan_mod._rule(m, n, k, dtype, cuda)
                # TMA on Hopper+ for 16-bit inputs whose rows are 16-byte multiples
                tma = cap >= (9, 0) and dtype != torch.float32 and n % 8 == 0 and k % 8 == 0
                assert p.wgrad_tma == int(tma), (cap, dtype, m, n, k)
                assert p.wgrad_num_stages == (4 if tma else 3)
                assert wgrad_tma_problem(p, dtype) is None
    monkeypatch.setattr(plan_mod, "tma_available", lambda: False)  # Triton < 3.4
    p = plan_mod._rule(16384, 4096, 4096, torch.bfloat16, cuda)
    assert p.wgrad_tma == 0
    assert "Triton >= 3.4" in wgrad_tma_problem(dataclasses.replace(p, wgrad_tma=1),
                                                torch.bfloat16)
    monkeypatch.undo()
    # rows of 100 bf16 = 200 bytes (not a multiple of 16); fp32 100 * 4 = 400 is
    plan = dataclasses.replace(make_plan(64, 100, 64, torch.bfloat16, DEV), wgrad_tma=1)
    assert "multiples of 8" in wgrad_tma_problem(plan, torch.bfloat16)
    assert wgrad_tma_problem(plan, torch.float32) is None
    assert wgrad_tma_problem(dataclasses.replace(plan, wgrad_tma=0), torch.bfloat16) is None
    x = torch.ones(64, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.ones(100, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="wgrad_tma=1 needs out_features N"):
        dense_projection_det(x, w, plan=plan)
    with pytest.raises(ValueError, match="wgrad_tma=1 needs"):
        dense_projection_det_fwd(x, w, plan=plan)
    dense_projection_det(x.float(), w.float(), plan=plan)  # fp32 rows are 16-byte multiples
    with pytest.raises(ValueError, match="wgrad_tma"):
        dataclasses.replace(plan, wgrad_tma=3)
    with pytest.raises(ValueError, match="TMA box"):
        dataclasses.replace(plan, wgrad_block_m=512)


def test_wgrad_tma_plan_serialisation():
    plan = _plan(torch.bfloat16, 2)
    d = plan.to_dict()
    assert d["wgrad_tma"] == 2 and d["version"] == 2
    assert DenseProjectionDetPlan.from_dict(d) == plan
    assert plan.key != dataclasses.replace(plan, wgrad_tma=0).key
    old = {k: v for k, v in d.items() if k != "wgrad_tma"}
    old["version"] = 1  # a plan serialised before the field existed
    with pytest.raises(ValueError, match="format version 1"):
        DenseProjectionDetPlan.from_dict(old)
    with pytest.raises(ValueError, match="wgrad_tma"):
        DenseProjectionDetPlan.from_dict({**old, "version": 2})  # missing field
