"""y, dx, dW and main_grad are bitwise repeatable under one plan; a reordered split-K sum is
not (the test can fail); another split is another order."""

import dataclasses

import torch
from _moe_cases import DEV, make
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


def _plan(x, w, splits):
    M, (E, N, K) = x.shape[0], w.shape
    return dataclasses.replace(make_plan(M, E, N, K, x.dtype, DEV), wgrad_splits=splits,
                               wgrad_block_k=16)


def test_repeat_bitwise_with_other_kernels_between():
    x, w, offs, dy = make(SIZES, dtype=torch.bfloat16, tail=3)
    plan = _plan(x, w, 3)
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
x = randn((70, 24), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
w = randn((3, 20, 24), torch.bfloat16, dev, seed=2).requires_grad_()
offs = torch.tensor([30, 30, 66], dtype=torch.int32, device=dev)
mg = randn((3, 20, 24), torch.float32, dev, seed=5)
dy = randn((70, 20), torch.bfloat16, dev, seed=4, scale=10.0)
y = moe_grouped_det_gemm(x, w, offs)
y.backward(dy)
moe_grouped_det_gemm(x.detach(), w, offs, main_grad=mg).backward(dy)
d = hashlib.sha256()
for t in (y, x.grad, w.grad, mg):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
