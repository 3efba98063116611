"""Parity of cake-rmsnorm-nondet-train's y, dx, dweight (and h, dresidual) with the float64
reference, on a few of cake-rmsnorm-det-train's cases: dtypes, ragged H, 0 rows, 3-D with
a residual and an fp32 weight, the weight-free module, the accumulator, torch.compile."""

import pytest
import torch
from _rmsnorm_nd_cases import DEV, make, reference
from cake_core.testing import TOLERANCES, assert_close_to_reference, randn, rel_fro_error
from cake_rmsnorm_det_train import rmsnorm_det
from cake_rmsnorm_nondet_train import (
    RMSNormNondet,
    rmsnorm_nondet,
    rmsnorm_nondet_bwd,
    rmsnorm_nondet_fwd,
)


@pytest.mark.parametrize("H,rows,dtype", [(7, 3, torch.float32), (64, 257, torch.bfloat16),
                                          (1000, 5, torch.float16), (64, 0, torch.float32)],
                         ids=str)
def test_parity_2d(H, rows, dtype):
    x, w, dy = make((rows, H), dtype, seed=H + rows)
    x.requires_grad_()
    w.requires_grad_()
    y = rmsnorm_nondet(x, w, 1e-6)
    y.backward(dy)
    y64, dx64, dw64, _, _ = reference(x, w, dy, 1e-6)
    assert y.shape == x.shape and y.dtype == dtype and w.grad.dtype == dtype
    assert_close_to_reference(y, y64, dtype, "y")
    assert_close_to_reference(x.grad, dx64, dtype, "dx")
    if rows == 0:
        assert torch.equal(w.grad, torch.zeros_like(w))
    else:
        assert_close_to_reference(w.grad, dw64, dtype, "dweight")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_parity_3d_fp32_weight_and_residual(dtype):
    x, w, dy = make((2, 19, 96), dtype, seed=1, w_dtype=torch.float32)
    r = randn((2, 19, 96), dtype, DEV, seed=5)
    dh = randn((2, 19, 96), dtype, DEV, seed=6)
    x.requires_grad_()
    r.requires_grad_()
    w.requires_grad_()
    y, h = rmsnorm_nondet(x, w, 1e-5, residual=r)
    torch.autograd.backward([y, h], [dy, dh])
    y64, dx64, dw64, dr64, h64 = reference(x, w, dy, 1e-5, residual=r, dh=dh)
    assert w.grad.dtype == torch.float32
    for name, got, want in (("h", h, h64), ("y", y, y64), ("dx", x.grad, dx64),
                            ("dresidual", r.grad, dr64), ("dweight", w.grad, dw64)):
        assert_close_to_reference(got, want, dtype, name)


def test_weight_free_module_matches_torch():
    """``elementwise_affine=False``: a ones weight stands in, as torch.nn.RMSNorm."""
    x = randn((6, 5, 48), torch.float32, DEV, seed=3).requires_grad_()
    got = RMSNormNondet((5, 48), eps=1e-6, elementwise_affine=False)(x)
    want = torch.nn.RMSNorm((5, 48), eps=1e-6, elementwise_affine=False)(x)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    got.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_low_level_matches_autograd_and_det_forward():
    x, w, dy = make((33, 200), seed=11)
    y, saved = rmsnorm_nondet_fwd(x, w)
    g = rmsnorm_nondet_bwd(dy, None, saved)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y2 = rmsnorm_nondet(xx, ww)
    y2.backward(dy)
    assert torch.equal(y, y2) and torch.equal(g.dx, xx.grad) and torch.equal(g.dweight, ww.grad)
    assert g.dresidual is None
    assert torch.equal(y, rmsnorm_det(x, w))  # the det package's forward kernel today


def test_dweight_accumulator():
    x, w, dy = make((70, 96), torch.bfloat16, seed=31)
    main_grad = randn((96,), torch.float32, DEV, seed=34)
    start = main_grad.clone()
    xx = x.clone().requires_grad_()
    ww = w.clone().requires_grad_()
    rmsnorm_nondet(xx, ww, dweight_accumulator=main_grad).backward(dy)
    assert ww.grad is None
    _, _, dw64, _, _ = reference(x, w, dy, 1e-6)
    assert rel_fro_error(main_grad - start, dw64) < TOLERANCES[torch.bfloat16]


def test_torch_compile_fullgraph_runs_the_nondet_ops():
    x, w, dy = make((9, 64), seed=41)
    fn = torch.compile(lambda a, b: rmsnorm_nondet(a, b), fullgraph=True, backend="aot_eager")
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xx, ww)
    y.backward(dy)
    y64, dx64, dw64, _, _ = reference(x, w, dy, 1e-6)
    assert_close_to_reference(y, y64, torch.float32, "y")
    assert_close_to_reference(xx.grad, dx64, torch.float32, "dx")
    assert_close_to_reference(ww.grad, dw64, torch.float32, "dweight")
