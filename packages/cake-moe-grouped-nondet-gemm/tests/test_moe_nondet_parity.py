"""Parity of the nondet grouped GEMM and layer with the float64 references (the det
package's cases: ragged groups with empty experts, rows past the last expert, the layer
with an expert no token picks)."""

import pytest
import torch
from _moe_nd_cases import DEV, DTYPE, make
from cake_core.testing import TOLERANCES, assert_close_to_reference, randn
from cake_moe_grouped_det_gemm import (
    moe_experts_det,
    moe_feed_forward_det,
    moe_feed_forward_reference,
    moe_grouped_det_gemm,
    moe_grouped_gemm_reference,
)
from cake_moe_grouped_nondet_gemm import (
    moe_experts_nondet,
    moe_feed_forward_nondet,
    moe_grouped_nondet_gemm,
)


@pytest.mark.parametrize("sizes,tail", [([7, 0, 19, 1, 0, 13], 0), ([5, 0, 11], 9),
                                        ([0, 0, 0], 0)])
def test_grouped_gemm_against_float64(sizes, tail):
    x, w, offs, dy = make(sizes, tail=tail)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = moe_grouped_nondet_gemm(xx, ww, offs)
    y.backward(dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = moe_grouped_gemm_reference(x64, w64, offs, dtype=torch.float64)
    ref.backward(dy.double())
    for name, got, want in (("y", y, ref), ("dx", xx.grad, x64.grad), ("dW", ww.grad, w64.grad)):
        assert got.dtype == DTYPE and bool(torch.isfinite(got).all()), name
        if want.numel() == 0 or float(want.detach().abs().max()) == 0:
            assert bool((got == 0).all()), name
        else:
            assert_close_to_reference(got.detach(), want.detach(), DTYPE, name)
    for e, m in enumerate(sizes):  # an expert with zero tokens: an exact-zero dW
        if m == 0:
            assert bool((ww.grad[e] == 0).all())


def test_grouped_gemm_same_values_as_det_today():
    x, w, offs, dy = make([3, 0, 12], seed=2)
    outs = []
    for fn in (moe_grouped_nondet_gemm, moe_grouped_det_gemm):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xx, ww, offs)
        y.backward(dy)
        outs.append((y.detach(), xx.grad, ww.grad))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_layer_against_float64_with_an_empty_expert():
    """Router column 0 against a constant feature: expert 0 always first, expert 2 never
    chosen (k = 2 of 4): exact-zero weight gradients for expert 2."""
    D, Fd, E, T = 16, 12, 4, 9
    x = randn((T, D), torch.float32, DEV, seed=4)
    x[:, 0] = 4.0
    x = x.to(DTYPE)
    rw = randn((E, D), DTYPE, DEV, seed=1, scale=D ** -0.5)
    rw[:, 0] = torch.tensor([2.0, 0.0, -2.0, 0.0]).to(DTYPE)
    wgu = randn((E, 2 * Fd, D), DTYPE, DEV, seed=2, scale=D ** -0.5)
    wd = randn((E, D, Fd), DTYPE, DEV, seed=3, scale=Fd ** -0.5)
    dy = randn((T, D), DTYPE, DEV, seed=5)
    leaves = [t.detach().clone().requires_grad_() for t in (x, rw, wgu, wd)]
    y, aux = moe_feed_forward_nondet(*leaves, 2)
    ((y.float() * dy.float()).sum() + 3.0 * aux).backward()
    refs = [t.detach().double().requires_grad_() for t in (x, rw, wgu, wd)]
    yr, ar = moe_feed_forward_reference(*refs, 2)
    ((yr * dy.double()).sum() + 3.0 * ar).backward()
    aux, ar = float(aux.detach()), float(ar.detach())
    assert abs(aux - ar) <= 1e-6 * abs(ar) + 1e-9
    assert_close_to_reference(y.detach(), yr.detach(), DTYPE, "y")
    for name, g, r in zip(("dx", "drouter", "dw_gate_up", "dw_down"), leaves, refs, strict=True):
        # the router gradient passes the fp32 softmax: a few fp32 roundings more (as det's)
        tol = 4 * TOLERANCES[DTYPE] if name == "drouter" else None
        assert_close_to_reference(g.grad, r.grad, DTYPE, name=name, tol=tol)
    assert bool((leaves[2].grad[2] == 0).all()) and bool((leaves[3].grad[2] == 0).all())
    y2, aux2 = moe_feed_forward_det(x, rw, wgu, wd, 2)
    torch.testing.assert_close(y.detach(), y2, rtol=0, atol=0)


def test_experts_entry_against_float64_and_det():
    """moe_experts_nondet under caller-computed logits: float64 parity of y and every
    gradient, and the det entry's values (the same kernels today)."""
    D, Fd, E, T = 16, 12, 4, 11
    x = randn((T, D), DTYPE, DEV, seed=7)
    rw = randn((E, D), DTYPE, DEV, seed=8, scale=D ** -0.5)
    wgu = randn((E, 2 * Fd, D), DTYPE, DEV, seed=9, scale=D ** -0.5)
    wd = randn((E, D, Fd), DTYPE, DEV, seed=10, scale=Fd ** -0.5)
    dy = randn((T, D), DTYPE, DEV, seed=11)
    leaves = [t.detach().clone().requires_grad_() for t in (x, rw, wgu, wd)]
    y = moe_experts_nondet(leaves[0], leaves[0] @ leaves[1].t(), leaves[2], leaves[3], 2)
    (y.float() * dy.float()).sum().backward()
    refs = [t.detach().double().requires_grad_() for t in (x, rw, wgu, wd)]
    yr, _ = moe_feed_forward_reference(*refs, 2, aux_loss_coef=0.0)
    (yr * dy.double()).sum().backward()
    assert_close_to_reference(y.detach(), yr.detach(), DTYPE, "y")
    for name, g, r in zip(("dx", "drouter", "dw_gate_up", "dw_down"), leaves, refs, strict=True):
        tol = 4 * TOLERANCES[DTYPE] if name in ("dx", "drouter") else None
        assert_close_to_reference(g.grad, r.grad, DTYPE, name=name, tol=tol)
    logits = x @ rw.t()
    torch.testing.assert_close(moe_experts_nondet(x, logits, wgu, wd, 2),
                               moe_experts_det(x, logits, wgu, wd, 2), rtol=0, atol=0)
