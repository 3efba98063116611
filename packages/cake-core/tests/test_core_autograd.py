"""cake_core.autograd.once_differentiable: refuses a second differentiation even when the
upstream gradient needs no grad (torch's decorator then returns gradients without a
grad_fn, and a gradient penalty built from them silently contributes nothing)."""

import pytest
import torch
from cake_core.autograd import once_differentiable


def _function(decorator):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, n):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        @decorator
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            return dy @ w, dy.t() @ x, None

    return F


def _penalty_backward(F):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    out = F.apply(x, w, 2).sum()
    (g,) = torch.autograd.grad(out, x, create_graph=True)
    (out + g.pow(2).sum()).backward()


def test_constant_upstream_gradient_still_refused():
    with pytest.raises(RuntimeError, match="differentiate twice"):
        _penalty_backward(_function(once_differentiable))
    # the test can fail: torch's decorator drops the penalty term without a word
    _penalty_backward(_function(torch.autograd.function.once_differentiable))


def test_refused_also_through_autograd_grad_towards_an_input():
    """autograd.grad(..., [w]) only runs nodes on paths to w: the error must sit on one."""
    F = _function(once_differentiable)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    for make in (lambda: F.apply(x, w, 2).sum(), lambda: F.apply(x, w, 2).pow(2).sum()):
        out = make()
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        with pytest.raises(RuntimeError, match="differentiate twice"):
            torch.autograd.grad(out + g.pow(2).sum(), [w])
        with pytest.raises(RuntimeError, match="differentiate twice"):
            torch.autograd.grad(g.pow(2).sum(), [w], allow_unused=True)


def test_plain_backward_unchanged():
    F = _function(once_differentiable)
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    F.apply(x, w, 2).pow(2).sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x2 @ w2.t()).pow(2).sum().backward()
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    assert x.grad.grad_fn is None
