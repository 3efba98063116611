"""dweight is bitwise repeatable under one plan; a reordered sum is not (the test can fail)."""

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
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetWorkspace,
    make_plan,
    rmsnorm_silu_gate_det,
    rmsnorm_silu_gate_det_bwd,
    rmsnorm_silu_gate_det_fwd,
)

DEV = default_device()


def _inputs(rows=300, D=128, dtype=torch.bfloat16):
    x = randn((rows, D), dtype, DEV, seed=1, scale=3.0)
    z = randn((rows, D), dtype, DEV, seed=2, scale=3.0)
    w = randn((D,), dtype, DEV, seed=3)
    dy = randn((rows, D), dtype, DEV, seed=4, scale=10.0)
    return x, z, w, dy


@pytest.mark.parametrize("norm_before_gate,activation",
                         [(True, "silu"), (False, "silu"), (True, "sigmoid")],
                         ids=["fla", "mamba", "fla-sigmoid"])
def test_repeat_bitwise_with_other_kernels_between(norm_before_gate, activation):
    x, z, w, dy = _inputs()

    def step():
        xx, zz, ww = (t.clone().requires_grad_() for t in (x, z, w))
        y = rmsnorm_silu_gate_det(xx, zz, ww, norm_before_gate=norm_before_gate, group_size=64,
                                  activation=activation)
        y.backward(dy)
        return y, xx.grad, zz.grad, ww.grad

    def noise():  # other work on the device between repeats
        a = torch.randn(64, 64, device=DEV)
        rmsnorm_silu_gate_det(a, a.flip(0), torch.ones(64, device=DEV)).sum()
        (a @ a).sum().item()

    assert_bitwise_repeat(step, repeats=3, between=noise)


def test_reordered_partial_sum_changes_bits():
    """The det order vs the same partials summed in other orders (what atomics would do).

    The fixed order is exactly ((p[0] + p[1]) + p[2]) + ...: dweight equals that sequential
    fp32 sum bitwise, repeats bitwise, and some other arrival order changes the bits."""
    x, z, w, dy = _inputs()
    w = w.float()  # fp32 dweight: the ordered sum itself, no cast
    plan = dataclasses.replace(make_plan(x.shape[-1], x.dtype, DEV), bwd_programs=8,
                               block_m_bwd=8)
    ws = RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)
    _, saved = rmsnorm_silu_gate_det_fwd(x, z, w, plan=plan)
    ordered = rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws).dweight
    parts = ws["partials"].clone()
    in_order = parts[0].clone()
    for i in range(1, parts.shape[0]):
        in_order = in_order + parts[i]
    assert bitwise_equal(ordered, in_order)
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(20):
        perm = torch.randperm(parts.shape[0], generator=gen).tolist()
        s = parts[perm[0]].clone()
        for i in perm[1:]:  # sequential fp32 adds in arrival order
            s = s + parts[i]
        differs += not bitwise_equal(s, ordered)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws).dweight
    assert bitwise_equal(again, ordered)


def test_other_plan_other_order():
    """Bits are promised per plan: another bwd_programs regroups the sum."""
    x, z, w, dy = _inputs()
    w = w.float()
    base = make_plan(x.shape[-1], x.dtype, DEV)
    dws = []
    for p in (3, 5, 7):
        plan = dataclasses.replace(base, bwd_programs=p, block_m_bwd=16)
        _, saved = rmsnorm_silu_gate_det_fwd(x, z, w, plan=plan)
        dws.append(rmsnorm_silu_gate_det_bwd(dy, saved).dweight)
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det
dev = default_device()
d = hashlib.sha256()
for nbg, G, act in ((True, None, "silu"), (False, 50, "silu"), (True, 40, "sigmoid")):
    x = randn((130, 200), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
    z = randn((130, 200), torch.bfloat16, dev, seed=2, scale=3.0).requires_grad_()
    w = randn((200,), torch.bfloat16, dev, seed=3).requires_grad_()
    dy = randn((130, 200), torch.bfloat16, dev, seed=4, scale=10.0)
    acc = randn((200,), torch.float32, dev, seed=5)
    y = rmsnorm_silu_gate_det(x, z, w, norm_before_gate=nbg, group_size=G, activation=act)
    y2 = rmsnorm_silu_gate_det(x, z, w, norm_before_gate=nbg, group_size=G, activation=act,
                               dweight_accumulator=acc)
    torch.autograd.backward([y, y2], [dy, dy])
    for t in (y, x.grad, z.grad, w.grad, acc):
        d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
