"""dweight is bitwise repeatable under one plan; a reordered sum is not (the test can fail)."""

import dataclasses

import torch
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import (
    RMSNormDetWorkspace,
    make_plan,
    rmsnorm_det,
    rmsnorm_det_bwd,
    rmsnorm_det_fwd,
)

DEV = default_device()


def _inputs(rows=300, H=256, dtype=torch.bfloat16):
    x = randn((rows, H), dtype, DEV, seed=1, scale=3.0)
    w = randn((H,), dtype, DEV, seed=2)
    dy = randn((rows, H), dtype, DEV, seed=3, scale=10.0)
    return x, w, dy


def test_repeat_bitwise_with_other_kernels_between():
    x, w, dy = _inputs()

    def step():
        xx = x.clone().requires_grad_()
        ww = w.clone().requires_grad_()
        rmsnorm_det(xx, ww).backward(dy)
        return xx.grad, ww.grad

    def noise():  # other work on the device between repeats
        a = torch.randn(64, 64, device=DEV)
        rmsnorm_det(a, torch.ones(64, device=DEV)).sum()
        (a @ a).sum().item()

    assert_bitwise_repeat(step, repeats=5, between=noise)


def test_reordered_partial_sum_changes_bits():
    """The det order vs the same partials summed in other orders (what atomics would do)."""
    x, w, dy = _inputs()
    plan = make_plan(x.shape[-1], x.dtype, DEV)
    plan = dataclasses.replace(plan, bwd_programs=8, reduce_block_p=8)
    ws = RMSNormDetWorkspace.for_plan(plan, DEV)
    _, saved = rmsnorm_det_fwd(x, w.float(), plan=plan)
    g = rmsnorm_det_bwd(dy, None, saved, workspace=ws)
    parts = ws["partials"].clone()
    ordered = g.dweight
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        perm = torch.randperm(parts.shape[0], generator=gen)
        s = torch.zeros_like(parts[0])
        for i in perm.tolist():  # sequential fp32 adds in arrival order
            s = s + parts[i]
        differs += not bitwise_equal(s, ordered)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = rmsnorm_det_bwd(dy, None, saved, workspace=ws).dweight
    assert bitwise_equal(again, ordered)


def test_other_plan_other_order():
    """Bits are promised per plan: another bwd_programs regroups the sum."""
    x, w, dy = _inputs()
    w = w.float()
    base = make_plan(x.shape[-1], x.dtype, DEV)
    dws = []
    for p in (3, 5, 7):
        plan = dataclasses.replace(base, bwd_programs=p, reduce_block_p=1)
        _, saved = rmsnorm_det_fwd(x, w, plan=plan)
        dws.append(rmsnorm_det_bwd(dy, None, saved).dweight)
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import rmsnorm_det
dev = default_device()
x = randn((300, 200), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
r = randn((300, 200), torch.bfloat16, dev, seed=2).requires_grad_()
w = randn((200,), torch.bfloat16, dev, seed=3).requires_grad_()
dy = randn((300, 200), torch.bfloat16, dev, seed=4, scale=10.0)
y, h = rmsnorm_det(x, w, residual=r)
torch.autograd.backward([y, h], [dy, dy])
d = hashlib.sha256()
for t in (y, h, x.grad, r.grad, w.grad):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
