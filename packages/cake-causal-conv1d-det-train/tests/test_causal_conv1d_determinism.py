"""Bitwise repeats; dweight / dbias summed in one fixed order (a reordered sum of the same
partials changes bits: the test can fail); the same bits process after process."""

import dataclasses

import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetWorkspace,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
    make_plan,
)
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device

DEV = default_device()


def test_repeat_bitwise_with_other_kernels_between(conv):
    inp = conv.make_inputs(1, conv.CU_RAGGED[-1], 20, 4, torch.bfloat16, cu=conv.CU_RAGGED,
                           seed=11)

    def step():
        return list(conv.run_cake(inp, "silu").values())

    def noise():  # other work between repeats
        other = conv.make_inputs(2, 9, 20, 4, torch.bfloat16, seed=99)
        conv.run_cake(other, None)

    assert_bitwise_repeat(step, repeats=2, between=noise)


def _long_input(T=300, D=16, W=4, seed=0):
    x = randn((1, T, D), torch.float32, DEV, seed=seed, scale=3.0)
    w = randn((D, W), torch.float32, DEV, seed=seed + 1)
    b = randn((D,), torch.float32, DEV, seed=seed + 2)
    dy = randn((1, T, D), torch.float32, DEV, seed=seed + 3, scale=10.0)
    return x, w, b, dy


def test_reordered_partial_sum_changes_bits():
    """dweight / dbias vs the same per-block partials summed in other orders (what
    atomics would do): some order changes bits, while the det order repeats exactly."""
    plan = make_plan(16, 4, torch.float32, DEV)
    T = max(300, 8 * plan.block_t_bwd + 13)  # at least 8 blocks on every device's plan
    x, w, b, dy = _long_input(T=T)
    ws = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=T)
    _, _, saved = causal_conv1d_det_fwd(x, w, b, activation="silu", plan=plan)
    g = causal_conv1d_det_bwd(dy, None, saved, workspace=ws)
    n_blocks = -(-T // plan.block_t_bwd)
    assert n_blocks >= 8
    for name, ordered in (("dweight_partials", g.dweight), ("dbias_partials", g.dbias)):
        parts = ws[name][:n_blocks].clone()
        s = torch.zeros_like(parts[0])
        for i in range(n_blocks):  # the det order, sequential fp32 adds
            s = s + parts[i]
        assert bitwise_equal(s, ordered), f"{name}: not the index-order sum"
        gen = torch.Generator().manual_seed(0)
        orders = [list(reversed(range(n_blocks)))] + [
            torch.randperm(n_blocks, generator=gen).tolist() for _ in range(10)]
        differs = 0
        for order in orders:
            s = torch.zeros_like(parts[0])
            for i in order:
                s = s + parts[i]
            differs += not bitwise_equal(s, ordered)
        assert differs > 0, f"{name}: no reordering changed the bits; cannot detect atomics"
    again = causal_conv1d_det_bwd(dy, None, saved, workspace=ws)
    assert bitwise_equal(again.dweight, g.dweight) and bitwise_equal(again.dbias, g.dbias)


def test_other_block_t_other_order():
    """Bits are promised per plan: another block_t_bwd regroups the sum."""
    x, w, b, dy = _long_input(T=160, seed=5)
    base = make_plan(16, 4, torch.float32, DEV)
    _, _, saved = causal_conv1d_det_fwd(x, w, b, activation="silu", plan=base)
    dws = [causal_conv1d_det_bwd(dy, None, saved,
                                 plan=dataclasses.replace(base, block_t_bwd=bt)).dweight
           for bt in (32, 64)]
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])
    torch.testing.assert_close(dws[1], dws[0], rtol=1e-5, atol=1e-5)


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_causal_conv1d_det_train import causal_conv1d_det
dev = default_device()
cu = torch.tensor([0, 0, 2, 40], dtype=torch.int32, device=dev)
x = randn((1, 40, 20), torch.bfloat16, dev, seed=1, scale=3.0).requires_grad_()
w = randn((20, 4), torch.bfloat16, dev, seed=2).requires_grad_()
b = randn((20,), torch.bfloat16, dev, seed=3).requires_grad_()
h0 = randn((3, 20, 3), torch.bfloat16, dev, seed=4).requires_grad_()
y, fs = causal_conv1d_det(x, w, b, activation="silu", cu_seqlens=cu, initial_state=h0,
                          output_final_state=True)
torch.autograd.backward([y, fs], [randn(y.shape, torch.bfloat16, dev, seed=5, scale=10.0),
                                  randn(fs.shape, torch.bfloat16, dev, seed=6)])
d = hashlib.sha256()
for t in (y, fs, x.grad, w.grad, b.grad, h0.grad):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
