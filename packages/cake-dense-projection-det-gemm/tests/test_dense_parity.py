"""Parity with the float64 reference (y, dx, dweight, dbias, main_grad) on odd shapes."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, bitwise_equal, poison_, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    dense_projection_det,
    dense_projection_det_bwd,
    dense_projection_det_fwd,
    dense_projection_reference,
    make_plan,
)

DEV = default_device()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# M, N, K: never multiples of a block; M = 1000 takes the split-K wgrad on the CPU plan
SHAPES = [(M, N, K) for M in (0, 1, 17) for N, K in ((1, 7), (7, 33), (33, 96))] + \
    [(1000, 33, 7), (1000, 96, 1)]


def _ref(x, w, b, dy):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    y = dense_projection_reference(x64, w64, b64, dtype=torch.float64)
    y.backward(dy.double())
    return y, x64.grad, w64.grad, (b64.grad if b is not None else None)


def _inputs(shape_x, N, dtype, bias, seed):
    K = shape_x[-1]
    x = randn(shape_x, dtype, DEV, seed=seed).requires_grad_()
    w = randn((N, K), dtype, DEV, seed=seed + 1, scale=K ** -0.5).requires_grad_()
    b = randn((N,), dtype, DEV, seed=seed + 2).requires_grad_() if bias else None
    dy = randn((*shape_x[:-1], N), dtype, DEV, seed=seed + 3)
    return x, w, b, dy


def _check(x, w, b, dy, y, dtype, main_grad=None, start=None):
    y64, dx64, dw64, db64 = _ref(x, w, b, dy)
    assert y.shape == y64.shape and y.dtype == dtype
    empty = x.numel() == 0
    assert_close_to_reference(y, y64, dtype, "y")
    assert_close_to_reference(x.grad, dx64, dtype, "dx")
    if main_grad is None:
        assert w.grad.dtype == dtype
        if empty:
            assert torch.equal(w.grad, torch.zeros_like(w))
        else:
            assert_close_to_reference(w.grad, dw64, dtype, "dweight")
    else:
        assert w.grad is None
        if empty:
            assert torch.equal(main_grad, start)
        else:
            assert_close_to_reference(main_grad - start, dw64, dtype, "main_grad - start")
    if b is not None:
        if empty:
            assert torch.equal(b.grad, torch.zeros_like(b))
        else:
            assert_close_to_reference(b.grad, db64, dtype, "dbias")


@pytest.mark.parametrize("variant", ["plain", "bias+main_grad"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_parity_2d(shape, dtype, variant):
    M, N, K = shape
    with_extras = variant != "plain"
    x, w, b, dy = _inputs((M, K), N, dtype, with_extras, seed=M * 100 + N * 10 + K)
    main_grad = randn((N, K), torch.float32, DEV, seed=5) if with_extras else None
    start = main_grad.clone() if with_extras else None
    y = dense_projection_det(x, w, b, main_grad=main_grad)
    y.backward(dy)
    _check(x, w, b, dy, y, dtype, main_grad, start)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity_3d(dtype):
    x, w, b, dy = _inputs((2, 9, 33), 7, dtype, True, seed=7)
    y = dense_projection_det(x, w, b)
    y.backward(dy)
    assert y.shape == (2, 9, 7)
    _check(x, w, b, dy, y, dtype)


def test_main_grad_adds_the_fp32_sum_in_fixed_order():
    """main_grad receives exactly start + (the fp32 dW a zero main_grad receives)."""
    x, w, b, dy = _inputs((300, 40), 24, torch.bfloat16, False, seed=11)
    zero = torch.zeros(24, 40, device=DEV)
    dense_projection_det(x, w, main_grad=zero).backward(dy)
    start = randn((24, 40), torch.float32, DEV, seed=12)
    mg = start.clone()
    dense_projection_det(x, w, main_grad=mg).backward(dy)
    assert bitwise_equal(mg, start + zero)
    assert w.grad is None
    # fp32 inputs: the fp32 dW equals the main_grad sum bit for bit
    xf, wf = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    dense_projection_det(xf, wf).backward(dy.float())
    zf = torch.zeros(24, 40, device=DEV)
    dense_projection_det(xf.detach(), wf.detach().requires_grad_(), main_grad=zf).backward(
        dy.float())
    assert bitwise_equal(zf, wf.grad)


def test_low_level_matches_autograd():
    x, w, b, dy = _inputs((50, 20), 12, torch.float32, True, seed=21)
    y, saved = dense_projection_det_fwd(x, w, b)
    g = dense_projection_det_bwd(dy, saved)
    y2 = dense_projection_det(x, w, b)
    y2.backward(dy)
    assert bitwise_equal(y, y2) and bitwise_equal(g.dx, x.grad)
    assert bitwise_equal(g.dweight, w.grad) and bitwise_equal(g.dbias, b.grad)
    mg = torch.zeros(12, 20, device=DEV)
    g2 = dense_projection_det_bwd(dy, saved, main_grad=mg)
    assert g2.dweight is None and bitwise_equal(mg, g.dweight)
    _, saved_nb = dense_projection_det_fwd(x, w)
    assert dense_projection_det_bwd(dy, saved_nb).dbias is None


def test_outputs_are_fully_written(monkeypatch):
    """Poison every buffer the entry allocates: a skipped element would stay NaN."""
    import cake_dense_projection_det_gemm.api as api

    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(api.torch, "empty", poisoned_empty)
    for M, split in ((300, 1), (300, 3), (150, 16)):  # 16 slices of 150 tokens: empty ones
        x, w, b, dy = _inputs((M, 45), 37, torch.float16, True, seed=M + split)
        plan = dataclasses.replace(make_plan(M, 37, 45, torch.float16, DEV),
                                   wgrad_splits=split)
        dense_projection_det(x, w, b, plan=plan).backward(dy)
        for t in (x.grad, w.grad, b.grad):
            assert torch.isfinite(t.float()).all()
        _check(x, w, b, dy, dense_projection_det(x, w, b), torch.float16)


def test_strided_views_need_no_copies_and_give_same_bits():
    x0 = randn((33, 70), torch.float32, DEV, seed=31)
    w0 = randn((33, 24), torch.float32, DEV, seed=32)  # weight = w0.t(): strides (1, 24)
    x = x0.t().requires_grad_()                      # [70, 33], strides (1, 70)
    w = w0.t().requires_grad_()
    y = dense_projection_det(x, w)
    y.sum().backward()                                # dy expanded: strides (0, 0)
    xc, wc = x.detach().contiguous().requires_grad_(), w.detach().contiguous().requires_grad_()
    yc = dense_projection_det(xc, wc)
    yc.backward(torch.ones_like(yc))
    assert bitwise_equal(y, yc) and bitwise_equal(x.grad, xc.grad)
    assert bitwise_equal(w.grad, wc.grad)


@pytest.mark.parametrize("change", [{"cublas_fwd_dgrad": 1}, {"cublas_fwd_dgrad": 0},
                                    {"wgrad_splits": 5},
                                    {"block_m": 16, "block_n": 32, "block_k": 16,
                                     "group_m": 2, "cublas_fwd_dgrad": 0},
                                    {"block_m": 128, "block_n": 256, "block_k": 64,
                                     "num_warps": 8, "num_stages": 3, "wgrad_block_m": 128,
                                     "wgrad_block_n": 256, "wgrad_block_k": 64,
                                     "cublas_fwd_dgrad": 0}],
                         ids=["cublas", "cake-fwd", "splits5", "small-tiles", "big-tiles"])
def test_other_plans_meet_the_reference(change):
    x, w, b, dy = _inputs((3, 47, 40), 35, torch.bfloat16, True, seed=41)
    plan = dataclasses.replace(make_plan(141, 35, 40, torch.bfloat16, DEV), **change)
    y = dense_projection_det(x, w, b, plan=plan)
    y.backward(dy)
    _check(x, w, b, dy, y, torch.bfloat16)


def test_tf32_flag_only_changes_fp32_when_set():
    x, w, _, dy = _inputs((20, 40), 8, torch.float32, False, seed=51)
    plan = make_plan(20, 8, 40, torch.float32, DEV)
    assert plan.allow_tf32 == 0
    y = dense_projection_det(x, w, plan=dataclasses.replace(plan, allow_tf32=1))
    assert_close_to_reference(y, _ref(x, w, None, dy)[0], torch.float32, tol=2e-3)


@pytest.mark.parametrize("fp32_dots", [1, 2, 3], ids=["ieee", "tf32x3", "bf16x6"])
def test_fp32_dots_keep_fp32_accuracy(fp32_dots):
    # the split precisions (tensor-core products of bf16 / tf32 parts, the CUDA rule's
    # "bf16x6") stay within fp32's tolerance in every GEMM, bias and main_grad included
    x, w, b, dy = _inputs((300, 96), 40, torch.float32, True, seed=61)
    plan = dataclasses.replace(make_plan(300, 40, 96, torch.float32, DEV),
                               fp32_dots=fp32_dots)
    main_grad = randn((40, 96), torch.float32, DEV, seed=62)
    start = main_grad.clone()
    y = dense_projection_det(x, w, b, plan=plan, main_grad=main_grad)
    y.backward(dy)
    _check(x, w, b, dy, y, torch.float32, main_grad=main_grad, start=start)
    first = [t.clone() for t in (y, x.grad, main_grad, b.grad)]
    x.grad = b.grad = None
    main_grad.copy_(start)
    y = dense_projection_det(x, w, b, plan=plan, main_grad=main_grad)
    y.backward(dy)
    assert all(bitwise_equal(u, v) for u, v in
               zip(first, (y, x.grad, main_grad, b.grad), strict=True))
