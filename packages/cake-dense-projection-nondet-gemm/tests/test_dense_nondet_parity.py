"""Parity of the nondet dense projection with the float64 reference (the det package's
cases: with and without bias, M off the block sizes, the split-K wgrad, main_grad)."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import dense_projection_det, dense_projection_reference
from cake_dense_projection_nondet_gemm import dense_projection_nondet, make_nondet_plan

DEV = default_device()
DTYPE = torch.float32 if DEV.type == "cpu" else torch.bfloat16


def _inputs(M, N, K, bias, seed):
    x = randn((M, K), DTYPE, DEV, seed=seed)
    w = randn((N, K), DTYPE, DEV, seed=seed + 1, scale=K ** -0.5)
    b = randn((N,), DTYPE, DEV, seed=seed + 2) if bias else None
    dy = randn((M, N), DTYPE, DEV, seed=seed + 3)
    return x, w, b, dy


def _grads(fn, x, w, b, dy, **kw):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = fn(*leaves, **kw)
    y.backward(dy.to(y.dtype))
    return [y.detach()] + [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("M,N,K,bias", [(17, 7, 33, True), (17, 33, 96, False),
                                        (1, 1, 7, True), (1000, 33, 7, True)])
def test_against_float64(M, N, K, bias):
    """M = 17 is no multiple of a block; M = 1000 takes the split-K wgrad on the CPU plan."""
    case = _inputs(M, N, K, bias, seed=M + N)
    got = _grads(dense_projection_nondet, *case)
    want = _grads(lambda *a: dense_projection_reference(*a, dtype=torch.float64),
                  *[t.double() if t is not None else None for t in case])
    for name, g, w in zip(("y", "dx", "dweight", "dbias"), got, want, strict=True):
        if w is None:
            assert g is None
            continue
        assert g.dtype == DTYPE
        assert_close_to_reference(g, w, DTYPE, name)
    if M == 1000 and DEV.type == "cpu":
        assert make_nondet_plan(M, N, K, DTYPE, DEV).wgrad_splits > 1


def test_main_grad_against_float64():
    x, w, _, dy = _inputs(40, 12, 20, False, seed=3)
    start = randn((12, 20), torch.float32, DEV, seed=9)
    main_grad = start.clone()
    ww = w.detach().clone().requires_grad_()
    dense_projection_nondet(x, ww, main_grad=main_grad).backward(dy)
    assert ww.grad is None
    want = dy.double().t() @ x.double()
    assert_close_to_reference(main_grad - start, want, DTYPE, "main_grad - start")


def test_same_values_as_det_where_the_det_kernels_run():
    """Forward and dgrad are the det package's launches: the same bits; so are the weight
    and bias gradients where the plan keeps the det kernels (``cublas_wgrad = 0``)."""
    case = _inputs(33, 12, 20, True, seed=5)
    got = _grads(dense_projection_nondet, *case)
    want = _grads(dense_projection_det, *case)
    same = 4 if make_nondet_plan(33, 12, 20, DTYPE, DEV).cublas_wgrad == 0 else 2
    for g, w in zip(got[:same], want[:same], strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [0, 1, 77])
def test_cublas_wgrad_against_float64(dtype, M):
    """The plan's cuBLAS weight gradient and torch.sum bias gradient (the CUDA rule's for
    bf16 / fp16; forced here on any device), with and without ``main_grad``."""
    N, K = 24, 40
    x = randn((M, K), dtype, DEV, seed=M + 1)
    w = randn((N, K), dtype, DEV, seed=M + 2, scale=K ** -0.5)
    b = randn((N,), dtype, DEV, seed=M + 3)
    dy = randn((M, N), dtype, DEV, seed=M + 4)
    plan = dataclasses.replace(make_nondet_plan(M, N, K, dtype, DEV), cublas_wgrad=1,
                               wgrad_splits=1)
    got = _grads(lambda *a: dense_projection_nondet(*a, plan=plan), x, w, b, dy)
    want = _grads(lambda *a: dense_projection_reference(*a, dtype=torch.float64),
                  *(t.double() for t in (x, w, b, dy)))
    for name, g, ref in zip(("y", "dx", "dweight", "dbias"), got, want, strict=True):
        assert g.dtype == dtype
        assert_close_to_reference(g, ref, dtype, name)
    start = randn((N, K), torch.float32, DEV, seed=M + 5)
    main_grad = start.clone()
    ww = w.detach().clone().requires_grad_()
    dense_projection_nondet(x, ww, plan=plan, main_grad=main_grad).backward(dy)
    assert ww.grad is None
    assert_close_to_reference(main_grad - start, dy.double().t() @ x.double(), dtype,
                              "main_grad - start")
