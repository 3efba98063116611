"""Autograd helpers shared by the families.

:func:`once_differentiable` marks a ``torch.autograd.Function.backward`` as not twice
differentiable, like ``torch.autograd.function.once_differentiable``, with one difference:
torch's decorator attaches its "differentiate twice" error only when one of the backward's
incoming gradients requires grad. When none does (the upstream gradient of ``y.sum()`` is a
constant), torch's returns gradients without a ``grad_fn`` under ``create_graph=True``, so a
term built from them (a gradient penalty) silently contributes nothing to the second
backward. This one attaches the error whenever the backward runs with grad mode on (that
is, under ``create_graph=True``), and links it to the function's saved inputs that require
grad, so that ``torch.autograd.grad(..., inputs=[weight])`` (which only runs the nodes on
paths to its inputs) reaches it too: differentiating the gradients again then raises
``RuntimeError`` ("trying to differentiate twice a function that was marked with
@once_differentiable"), never returns a silently wrong result.
"""

from __future__ import annotations

import functools

import torch

_MSG = (b"trying to differentiate twice a function that was marked with @once_differentiable"
        b" (cake kernels are not twice differentiable)")


class _TwiceError(torch.autograd.Function):
    """Returns its first ``n`` arguments (the first backward's gradients) unchanged and links
    them to the remaining arguments (the function's saved inputs that require grad), so that
    a second differentiation that reaches any of those inputs runs this node's backward,
    which raises."""

    @staticmethod
    def forward(ctx, n, *ts):
        ctx.set_materialize_grads(False)
        return tuple(t.view_as(t) if isinstance(t, torch.Tensor) else t for t in ts[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_MSG.decode())


def once_differentiable(fn):
    """Decorator for ``backward(ctx, *grads)``; see the module docstring."""

    @functools.wraps(fn)
    def wrapper(ctx, *args):
        grad_mode = torch.is_grad_enabled()
        anchors = []
        if grad_mode:  # the saved inputs, unpacked before the backward may touch them
            anchors = [t for t in getattr(ctx, "saved_tensors", ())
                       if isinstance(t, torch.Tensor) and t.requires_grad]
        with torch.no_grad():
            outputs = fn(ctx, *args)
        if not grad_mode:
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if not any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs):
            return outputs
        if anchors:  # a second differentiation towards any saved input reaches the error
            res = _TwiceError.apply(len(outs), *outs, *anchors)
            res = res if isinstance(res, tuple) else (res,)
            return res[0] if single else tuple(res)
        # nothing saved needs grad: detached stand-ins that require grad carry the error
        err_fn = torch._C._functions.DelayedError(_MSG, len(outs))

        def fake_requires_grad(v):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v = v.detach()
                v.requires_grad = True
            return v

        res = err_fn(*[fake_requires_grad(o) for o in outs])
        return res[0] if single and isinstance(res, tuple) else res

    return wrapper
