"""y, dx, dW and main_grad are bitwise repeatable under one plan; a reordered split-K sum is
not (the test can fail); another split is another order. The repeat and two-process checks
also run with plan ``grouped_mm_fwd_dgrad = 1`` (forward and dgrad on torch._grouped_mm)."""

import dataclasses

import pytest
import torch
from _moe_cases import DEV, grouped_mm_route_missing, make
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetWorkspace,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)

SIZES = [150, 0, 1, 90]


#: (plan grouped_mm_fwd_dgrad, N): the route needs N and K multiples of 8
ROUTES = [pytest.param(0, 20, id="cake-fwd-dgrad"),
          pytest.param(1, 24, id="grouped-mm-fwd-dgrad", marks=pytest.mark.skipif(
              grouped_mm_route_missing() is not None, reason=str(grouped_mm_route_missing())))]


def _plan(x, w, splits, route=0):
    M, (E, N, K) = x.shape[0], w.shape
    return dataclasses.replace(make_plan(M, E, N, K, x.dtype, DEV), wgrad_splits=splits,
                               wgrad_block_k=16, grouped_mm_fwd_dgrad=route)


@pytest.mark.parametrize("route,N", ROUTES)
def test_repeat_bitwise_with_other_kernels_between(route, N):
    x, w, offs, dy = make(SIZES, N=N, dtype=torch.bfloat16, tail=3)
    plan = _plan(x, w, 3, route)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    mg = randn(w.shape, torch.float32, DEV, seed=5)

    def step():
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        acc = mg.clone()
        y = moe_grouped_det_gemm(xx, ww, offs, plan=plan, workspace=ws)
        y.backward(dy)
        moe_grouped_det_gemm(xx.detach(), ww, offs, plan=plan, workspace=ws,
                             main_grad=acc).backward(dy)
        return y, xx.grad, ww.grad, acc

    def noise():  # other work between repeats, on the same workspace buffers' neighbours
        a, b, o, d = make([4, 4], N=20, K=24, seed=7)
        moe_grouped_det_gemm(a, b, o).sum()
        ws["partials"].fill_(float("nan"))

    assert_bitwise_repeat(step, repeats=3, between=noise)


def test_reordered_split_sum_changes_bits():
    """The det slice order vs the same partials summed in other orders (what atomics
    would do): some order must change dW's bits, and the det path must not."""
    x, w, offs, dy = make(SIZES, N=16, K=16)
    x = x * 3.0
    dy = dy * 10.0
    plan = _plan(x, w, 8)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    g = moe_grouped_det_gemm_bwd(dy, saved, workspace=ws)
    parts = ws["partials"].clone()
    ordered = torch.zeros_like(parts[0])
    for i in range(parts.shape[0]):  # the documented order: ((p0 + p1) + p2) + ...
        ordered = ordered + parts[i]
    assert bitwise_equal(ordered, g.dweight)
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        s = torch.zeros_like(parts[0])
        for i in torch.randperm(parts.shape[0], generator=gen).tolist():
            s = s + parts[i]
        differs += not bitwise_equal(s, g.dweight)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = moe_grouped_det_gemm_bwd(dy, saved, workspace=ws)
    assert bitwise_equal(again.dweight, g.dweight) and bitwise_equal(again.dx, g.dx)


def test_other_plan_other_order():
    """Bits are promised per plan: another wgrad_splits regroups the sum."""
    x, w, offs, dy = make(SIZES, N=16, K=16)
    dws = []
    for s in (1, 3, 7):
        _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=_plan(x, w, s))
        dws.append(moe_grouped_det_gemm_bwd(dy, saved).dweight)
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm
dev = default_device()
import dataclasses
from cake_moe_grouped_det_gemm import make_plan
N, route = {N}, {route}
x = randn((70, 24), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
w = randn((3, N, 24), torch.bfloat16, dev, seed=2).requires_grad_()
offs = torch.tensor([30, 30, 66], dtype=torch.int32, device=dev)
mg = randn((3, N, 24), torch.float32, dev, seed=5)
dy = randn((70, N), torch.bfloat16, dev, seed=4, scale=10.0)
plan = dataclasses.replace(make_plan(70, 3, N, 24, torch.bfloat16, dev),
                           grouped_mm_fwd_dgrad=route)
y = moe_grouped_det_gemm(x, w, offs, plan=plan)
y.backward(dy)
moe_grouped_det_gemm(x.detach(), w, offs, plan=plan, main_grad=mg).backward(dy)
d = hashlib.sha256()
for t in (y, x.grad, w.grad, mg):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


@pytest.mark.parametrize("route,N", ROUTES)
def test_same_bits_process_after_process(route, N):
    assert_same_output_across_processes(_HASH_SCRIPT.format(N=N, route=route))
