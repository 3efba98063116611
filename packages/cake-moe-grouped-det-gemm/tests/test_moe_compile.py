"""torch.compile(fullgraph=True) routes through the custom ops and gives the eager bits,
with the offsets as a graph input (no host read, no graph break)."""

import dataclasses

import torch
from _moe_cases import DEV, make
from cake_core.testing import bitwise_equal, randn
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetWorkspace,
    make_plan,
    moe_grouped_det_gemm,
)

BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"


def test_compile_fullgraph_same_bits_main_grad_and_split():
    torch._dynamo.reset()
    x, w, offs, dy = make([9, 0, 17, 1], tail=2)
    plan = dataclasses.replace(make_plan(29, 4, 20, 24, torch.float32, DEV), wgrad_splits=3,
                               wgrad_block_k=16)
    # one workspace per call: under compile the custom op saves the workspace for the
    # backward, so two calls sharing one trip autograd's version check (the eager route
    # keeps it on ctx and allows sharing)
    ws, ws2 = (MoEGroupedDetWorkspace.for_plan(plan, DEV) for _ in range(2))
    mg0 = randn(w.shape, torch.float32, DEV, seed=8)

    def f(x, w, w2, offs, mg):
        y = moe_grouped_det_gemm(x, w, offs, plan=plan, workspace=ws)
        y2 = moe_grouped_det_gemm(x.detach(), w2, offs, plan=plan, workspace=ws2, main_grad=mg)
        return (y * torch.cos(y)).sum() + (y2 * y2).sum()

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend=BACKEND)):
        xx, ww, w2 = (t.clone().requires_grad_() for t in (x, w, w))
        mg = mg0.clone()
        fn(xx, ww, w2, offs, mg).backward()
        assert w2.grad is None and not bitwise_equal(mg, mg0)
        outs.append((xx.grad, ww.grad, mg))
    for a, b in zip(*outs, strict=True):
        assert bitwise_equal(a, b)


def test_moe_layer_compiles_fullgraph_with_the_eager_bits():
    """The MoE layer (router, permutation, grouped GEMMs, combine): the gather-sum kernels
    are custom ops under torch.compile, so fullgraph tracing has no break and the bits are
    the eager ones (forward, every gradient, the weights' gradient alone)."""
    from cake_moe_grouped_det_gemm import moe_feed_forward_det
    torch._dynamo.reset()
    T, D, F, E = 12, 24, 20, 5
    x = randn((T, D), torch.float32, DEV, seed=1)
    rw = randn((E, D), torch.float32, DEV, seed=2, scale=0.3)
    wgu = randn((E, 2 * F, D), torch.float32, DEV, seed=3, scale=0.2)
    wd = randn((E, D, F), torch.float32, DEV, seed=4, scale=0.2)

    def f(x, rw, wgu, wd):
        y, aux = moe_feed_forward_det(x, rw, wgu, wd, 2)
        return (y * y).sum() + aux

    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend=BACKEND)):
        leaves = [t.clone().requires_grad_() for t in (x, rw, wgu, wd)]
        loss = fn(*leaves)
        loss.backward()
        outs.append([loss.detach()] + [t.grad for t in leaves])
    assert all(bitwise_equal(a, b) for a, b in zip(*outs, strict=True))
