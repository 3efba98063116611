"""dW, dbias and main_grad are bitwise repeatable under one plan; a reordered split-K sum is
not (the test can fail)."""

import dataclasses

import pytest
import torch
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    DenseProjectionDetWorkspace,
    dense_projection_det,
    dense_projection_det_bwd,
    dense_projection_det_fwd,
    make_plan,
)

DEV = default_device()
M, N, K = 640, 24, 40


def _inputs(dtype=torch.float32):
    x = randn((M, K), dtype, DEV, seed=1, scale=3.0)
    w = randn((N, K), dtype, DEV, seed=2)
    b = randn((N,), dtype, DEV, seed=3)
    dy = randn((M, N), dtype, DEV, seed=4, scale=10.0)
    return x, w, b, dy


def test_repeat_bitwise_with_other_kernels_between():
    x, w, b, dy = _inputs(torch.bfloat16)
    mg = randn((N, K), torch.float32, DEV, seed=5)

    def step():
        xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
        acc = mg.clone()
        y = dense_projection_det(xx, ww, bb)
        y.backward(dy)
        dense_projection_det(xx.detach(), ww, bb.detach(), main_grad=acc).backward(dy)
        return y, xx.grad, ww.grad, bb.grad, acc

    def noise():  # other work between repeats
        a = torch.randn(64, 64, device=DEV)
        dense_projection_det(a, a).sum()
        (a @ a).sum().item()

    assert_bitwise_repeat(step, repeats=5, between=noise)


@pytest.mark.skipif(DEV.type != "cuda", reason="the cuBLAS route exists on CUDA only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_cublas_route_repeats_bitwise(dtype):
    """The plan's cuBLAS forward/dgrad (the CUDA default for 16-bit) repeats bit for bit,
    with other GEMMs of other shapes launched between the repeats; the evidence the plan
    rule rests on."""
    Mb, Nb, Kb = 4096, 1024, 2048
    x = randn((Mb, Kb), dtype, DEV, seed=11)
    w = randn((Nb, Kb), dtype, DEV, seed=12, scale=Kb ** -0.5)
    dy = randn((Mb, Nb), dtype, DEV, seed=13)
    plan = make_plan(Mb, Nb, Kb, dtype, DEV)
    assert plan.cublas_fwd_dgrad == 1

    def step():
        y, saved = dense_projection_det_fwd(x, w, plan=plan)
        g = dense_projection_det_bwd(dy, saved)
        return y, g.dx, g.dweight

    def noise():
        a = torch.randn(777, 333, device=DEV, dtype=dtype)
        (a @ a.t()).sum().item()

    assert_bitwise_repeat(step, repeats=5, between=noise)


def test_reordered_split_sum_changes_bits():
    """The det slice order vs the same partials summed in other orders (what atomics
    would do): some order must change dW's bits, and the det path must not."""
    x, w, b, dy = _inputs()
    plan = dataclasses.replace(make_plan(M, N, K, x.dtype, DEV), wgrad_splits=8)
    ws = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    _, saved = dense_projection_det_fwd(x, w, b, plan=plan)
    g = dense_projection_det_bwd(dy, saved, workspace=ws)
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
    for _ in range(2):
        again = dense_projection_det_bwd(dy, saved, workspace=ws)
        assert bitwise_equal(again.dweight, g.dweight) and bitwise_equal(again.dbias, g.dbias)


def test_other_plan_other_order():
    """Bits are promised per plan: another wgrad_splits regroups the sum."""
    x, w, b, dy = _inputs()
    base = make_plan(M, N, K, x.dtype, DEV)
    dws = []
    for s in (1, 3, 7):
        _, saved = dense_projection_det_fwd(x, w, plan=dataclasses.replace(base, wgrad_splits=s))
        dws.append(dense_projection_det_bwd(dy, saved).dweight)
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import dense_projection_det
dev = default_device()
x = randn((600, 40), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
w = randn((24, 40), torch.bfloat16, dev, seed=2).requires_grad_()
b = randn((24,), torch.bfloat16, dev, seed=3).requires_grad_()
mg = randn((24, 40), torch.float32, dev, seed=5)
dy = randn((600, 24), torch.bfloat16, dev, seed=4, scale=10.0)
y = dense_projection_det(x, w, b)
y.backward(dy)
dense_projection_det(x.detach(), w, main_grad=mg).backward(dy)
d = hashlib.sha256()
for t in (y, x.grad, w.grad, b.grad, mg):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
