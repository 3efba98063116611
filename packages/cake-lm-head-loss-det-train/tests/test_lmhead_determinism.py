"""Gradients are bitwise repeatable under one plan; chunk partials summed in another order
are not (so the repeat test can fail); another chunk size gives other bits."""

import dataclasses

import torch
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_same_output_across_processes,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import lm_head_loss_det, make_plan

DEV = default_device()
T, H, V = 128, 32, 500


def _inputs(dtype=torch.bfloat16):
    h = randn((T, H), dtype, DEV, seed=1, scale=2.0)
    w = randn((V, H), dtype, DEV, seed=2, scale=0.5)
    b = randn((V,), dtype, DEV, seed=3)
    y = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(4)).to(DEV)
    y[::7] = -100
    return h, w, b, y


def _plan(chunk, **kw):
    return dataclasses.replace(make_plan(H, V, torch.bfloat16, DEV), chunk_tokens=chunk,
                               **kw)


def test_repeat_bitwise_with_other_kernels_between():
    h, w, b, y = _inputs()
    up = randn((T,), torch.float32, DEV, seed=5)

    def step(reduction, gif):
        def run():
            hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
            plan = _plan(32, grad_in_forward=gif)
            loss = lm_head_loss_det(hh, ww, y, bias=bb, reduction=reduction, plan=plan,
                                    label_smoothing=0.1, z_loss=1e-3, logit_softcap=20.0)
            loss.backward(up if reduction == "none" else None)
            return loss, hh.grad, ww.grad, bb.grad
        return run

    def noise():  # other work on the device between repeats
        a = randn((20, 16), torch.float32, DEV, seed=9)
        lm_head_loss_det(a, randn((30, 16), torch.float32, DEV), torch.zeros(20, dtype=torch.long,
                                                                               device=DEV))
        (a @ a.T).sum().item()

    assert_bitwise_repeat(step("mean", 1), repeats=5, between=noise)
    assert_bitwise_repeat(step("none", 0), repeats=5, between=noise)


def test_reordered_chunk_sum_changes_bits():
    """dW = ((P0 + P1) + P2) + ... over chunk products P_c, in chunk order, in fp32. The same
    P_c summed in other orders (what atomics would do) must change bits at least once."""
    h, w, _, y = _inputs()
    plan = _plan(16)
    n = T // plan.chunk_tokens
    det = torch.zeros(V, H, device=DEV)  # main_grad = 0 + dW: the fp32 ordered sum itself
    lm_head_loss_det(h, w.clone().requires_grad_(), y, reduction="sum", plan=plan,
                     main_grad=det).backward()
    parts = []
    for c in range(n):  # each chunk alone, same plan: its product P_c, same kernels
        p = torch.zeros(V, H, device=DEV)
        s = slice(c * plan.chunk_tokens, (c + 1) * plan.chunk_tokens)
        lm_head_loss_det(h[s], w.clone().requires_grad_(), y[s], reduction="sum", plan=plan,
                         main_grad=p).backward()
        parts.append(p)
    in_order = parts[0].clone()
    for p in parts[1:]:
        in_order = in_order + p
    assert bitwise_equal(in_order, det), "the det path is not the chunk-ordered sum"
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(10):
        perm = torch.randperm(n, generator=gen).tolist()
        acc = parts[perm[0]].clone()
        for i in perm[1:]:
            acc = acc + parts[i]
        differs += not bitwise_equal(acc, det)
    assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"
    again = torch.zeros(V, H, device=DEV)
    lm_head_loss_det(h, w.clone().requires_grad_(), y, reduction="sum", plan=plan,
                     main_grad=again).backward()
    assert bitwise_equal(again, det)


def test_other_chunking_other_bits():
    """Bits are promised per plan: another chunk size regroups the dW sum."""
    h, w, _, y = _inputs()
    dws = []
    for chunk in (16, 32, 48):
        acc = torch.zeros(V, H, device=DEV)
        lm_head_loss_det(h, w.clone().requires_grad_(), y, plan=_plan(chunk),
                         main_grad=acc).backward()
        dws.append(acc)
    assert any(not bitwise_equal(dws[0], d) for d in dws[1:])
    torch.testing.assert_close(dws[0], dws[1], rtol=1e-5, atol=1e-7)


_HASH_SCRIPT = """
import hashlib, torch
from cake_core.testing import bits, randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import lm_head_loss_det
dev = default_device()
h = randn((70, 24), torch.bfloat16, dev, seed=1, scale=2.0).requires_grad_()
w = randn((300, 24), torch.bfloat16, dev, seed=2).requires_grad_()
b = randn((300,), torch.float32, dev, seed=3).requires_grad_()
y = torch.arange(70, device=dev) * 7 % 300
loss, lse = lm_head_loss_det(h, w, y, bias=b, z_loss=1e-3, return_lse=True)
loss.backward()
d = hashlib.sha256()
for t in (loss, lse, h.grad, w.grad, b.grad):
    d.update(bits(t).cpu().numpy().tobytes())
print(d.hexdigest())
"""


def test_same_bits_process_after_process():
    assert_same_output_across_processes(_HASH_SCRIPT)
