"""Parity with the float64 reference on fresh random inputs (y, dx, dweight, residual)."""

import math

import pytest
import torch
from cake_core.testing import TOLERANCES, assert_close_to_reference, poison_, randn, rel_fro_error
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import rmsnorm_det, rmsnorm_det_bwd, rmsnorm_det_fwd, rmsnorm_reference

DEV = default_device()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ref(x, w, dy, eps, residual=None, dh=None, offset=0.0):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    r64 = residual.detach().double().requires_grad_() if residual is not None else None
    out = rmsnorm_reference(x64, w64, eps, r64, dtype=torch.float64, offset=offset)
    if residual is None:
        out.backward(dy.double())
        return out, x64.grad, w64.grad, None, None
    y, h = out
    torch.autograd.backward([y, h], [dy.double(), dh.double()])
    return y, x64.grad, w64.grad, r64.grad, h


def _check_dx(dx, dx_ref, w, dy, x, dtype):
    # For tiny H the true dx is a small difference of O(rstd*w*dy) terms: measure the error
    # against that scale, not against the (near-zero) true value.
    rms = x.detach().double().pow(2).mean(-1).clamp_min(1e-12).sqrt().mean()
    scale = (dy.double() * w.detach().double()).norm() / rms
    err = (dx.double().cpu() - dx_ref.cpu()).norm() / max(float(dx_ref.norm()), float(scale), 1e-30)
    assert torch.isfinite(dx.float()).all()
    assert err <= TOLERANCES[dtype], f"dx error {err:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [0, 1, 3, 257])
@pytest.mark.parametrize("H", [1, 7, 64, 1000, 4096, 5120])
def test_parity_2d(H, rows, dtype):
    eps = 1e-6
    x = randn((rows, H), dtype, DEV, seed=H * 1000 + rows).requires_grad_()
    w = randn((H,), dtype, DEV, seed=7 + H, scale=0.5).add_(1).requires_grad_()
    y = rmsnorm_det(x, w, eps)
    dy = randn((rows, H), dtype, DEV, seed=99 + rows)
    y.backward(dy)
    y64, dx64, dw64, _, _ = _ref(x, w, dy, eps)
    assert y.shape == x.shape and y.dtype == dtype and w.grad.dtype == dtype
    assert_close_to_reference(y, y64, dtype, "y")
    _check_dx(x.grad, dx64, w, dy, x, dtype)
    if rows == 0:
        assert torch.equal(w.grad, torch.zeros_like(w))
    else:
        assert_close_to_reference(w.grad, dw64, dtype, "dweight")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity_3d_fp32_weight_and_residual(dtype):
    B, T, H = 2, 37, 384
    eps = 1e-5
    x = randn((B, T, H), dtype, DEV, seed=1).requires_grad_()
    r = randn((B, T, H), dtype, DEV, seed=2).requires_grad_()
    w = randn((H,), torch.float32, DEV, seed=3).requires_grad_()
    y, h = rmsnorm_det(x, w, eps, residual=r)
    dy, dh = randn((B, T, H), dtype, DEV, seed=4), randn((B, T, H), dtype, DEV, seed=5)
    torch.autograd.backward([y, h], [dy, dh])
    y64, dx64, dw64, dr64, h64 = _ref(x, w, dy, eps, residual=r, dh=dh)
    assert w.grad.dtype == torch.float32
    assert_close_to_reference(h, h64, dtype, "h")
    assert_close_to_reference(y, y64, dtype, "y")
    assert_close_to_reference(x.grad, dx64, dtype, "dx")
    assert_close_to_reference(r.grad, dr64, dtype, "dresidual")
    assert_close_to_reference(w.grad, dw64, dtype, "dweight")


def test_low_level_matches_autograd_and_poison():
    H = 200
    x = randn((33, H), torch.float32, DEV, seed=11).requires_grad_()
    w = randn((H,), torch.float32, DEV, seed=12).requires_grad_()
    dy = randn((33, H), torch.float32, DEV, seed=13)
    y, saved = rmsnorm_det_fwd(x, w)
    g = rmsnorm_det_bwd(dy, None, saved)
    y2 = rmsnorm_det(x, w)
    y2.backward(dy)
    assert torch.equal(y, y2) and torch.equal(g.dx, x.grad) and torch.equal(g.dweight, w.grad)
    assert g.dresidual is None


def test_outputs_are_fully_written(monkeypatch):
    """Poison every buffer the entry allocates: a skipped element would stay NaN."""
    import cake_rmsnorm_det_train.api as api

    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(api.torch, "empty", poisoned_empty)
    x = randn((45, 100), torch.float16, DEV, seed=21).requires_grad_()
    r = randn((45, 100), torch.float16, DEV, seed=22)
    w = randn((100,), torch.float16, DEV, seed=23).requires_grad_()
    y, h = rmsnorm_det(x, w, residual=r)
    (y.float().sum() + h.float().sum()).backward()
    for t in (y, h, x.grad, w.grad):
        assert torch.isfinite(t.float()).all()


def test_dweight_accumulator_adds_in_fixed_order():
    H = 96
    x = randn((70, H), torch.bfloat16, DEV, seed=31).requires_grad_()
    w = randn((H,), torch.bfloat16, DEV, seed=32).requires_grad_()
    dy = randn((70, H), torch.bfloat16, DEV, seed=33)
    main_grad = randn((H,), torch.float32, DEV, seed=34)
    start = main_grad.clone()
    rmsnorm_det(x, w, dweight_accumulator=main_grad).backward(dy)
    assert w.grad is None
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().float().requires_grad_()
    rmsnorm_det(x2, w2).backward(dy)  # fp32 weight: dweight is the fp32 ordered sum
    assert torch.equal(main_grad, start + w2.grad)
    _, _, dw64, _, _ = _ref(x, w, dy, 1e-6)
    assert rel_fro_error(main_grad - start, dw64) < TOLERANCES[torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", [1.0, -0.25])
@pytest.mark.parametrize("residual", [False, True])
def test_parity_weight_offset(offset, dtype, residual):
    """``offset``: y = xhat * (offset + w) (Gemma / Qwen3-Next zero-centred weights), dweight
    the gradient of w; the low-level pair keeps the offset in its saved set."""
    rows, H, eps = 67, 320, 1e-6
    x = randn((rows, H), dtype, DEV, seed=31).requires_grad_()
    w = randn((H,), dtype, DEV, seed=32, scale=0.2).requires_grad_()  # near 0: offset matters
    r = randn((rows, H), dtype, DEV, seed=33) if residual else None
    dy = randn((rows, H), dtype, DEV, seed=34)
    dh = randn((rows, H), dtype, DEV, seed=35) if residual else None
    out = rmsnorm_det(x, w, eps, offset=offset, residual=r)
    y = out[0] if residual else out
    torch.autograd.backward([y, out[1]] if residual else [y], [dy, dh] if residual else [dy])
    y64, dx64, dw64, _, _ = _ref(x, w, dy, eps, r, dh, offset=offset)
    assert_close_to_reference(y, y64, dtype, "y")
    _check_dx(x.grad, dx64, w.detach() + offset, dy, x, dtype)
    assert_close_to_reference(w.grad, dw64, dtype, "dweight")
    outs, saved = rmsnorm_det_fwd(x.detach(), w.detach(), eps, offset=offset, residual=r)
    g = rmsnorm_det_bwd(dy, dh, saved)
    assert torch.equal(outs[0] if residual else outs, y)
    assert torch.equal(g.dx, x.grad) and torch.equal(g.dweight, w.grad)


def test_offset_equals_the_offset_weight_bitwise():
    """With fp32 weights, ``offset=1`` gives the bits of passing ``1 + w`` (the weight is
    offset in fp32 in the kernels, as torch forms ``1 + w``), dweight included."""
    x = randn((45, 256), torch.bfloat16, DEV, seed=41).requires_grad_()
    w = randn((256,), torch.float32, DEV, seed=42, scale=0.1).requires_grad_()
    dy = randn((45, 256), torch.bfloat16, DEV, seed=43)
    rmsnorm_det(x, 1.0 + w, 1e-6).backward(dy)
    ref = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    y = rmsnorm_det(x, w, 1e-6, offset=1.0)
    y.backward(dy)
    assert torch.equal(y, rmsnorm_det(x.detach(), 1.0 + w.detach(), 1e-6))
    assert torch.equal(x.grad, ref[0]) and torch.equal(w.grad, ref[1])


def test_offset_spellings_run_one_kernel_value(monkeypatch):
    """An offset of any real type (int, numpy scalar) gives the bits of the equal float, and
    the kernels get a Python float, -0.0 as 0.0 (a constexpr's repr keys Triton's cache: one
    specialization per value). The backward checks a hand-built saved set's offset."""
    import cake_rmsnorm_det_train.api as api
    import numpy as np

    x = randn((9, 64), torch.float32, DEV, seed=51)
    w = randn((64,), torch.float32, DEV, seed=52, scale=0.1)
    dy = randn((9, 64), torch.float32, DEV, seed=53)
    launched = []
    real = api._launch_fwd

    def spy(*a):
        launched.append(a[-1])
        return real(*a)

    monkeypatch.setattr(api, "_launch_fwd", spy)
    want = rmsnorm_det(x, w, 1e-6, offset=1.0)
    for off in (1, np.float32(1.0), np.float64(1.0), np.int64(1)):
        assert torch.equal(rmsnorm_det(x, w, 1e-6, offset=off), want), repr(off)
    rmsnorm_det(x, w, 1e-6, offset=-0.0)
    _, saved = rmsnorm_det_fwd(x, w, 1e-6, offset=np.float32(-0.0))
    assert all(type(v) is float for v in launched) and launched[-2:] == [0.0, 0.0]
    assert all(math.copysign(1.0, v) == 1.0 for v in launched[-2:])
    saved.meta["offset"] = 1e39  # beyond fp32: the kernels' add would make it inf
    with pytest.raises(ValueError, match=r"saved.meta\['offset'\]"):
        rmsnorm_det_bwd(dy, None, saved)
