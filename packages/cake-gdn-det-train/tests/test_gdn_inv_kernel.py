"""``plan.inv_kernel = 1`` (format 9): each chunk's T = (I + A_raw)^-1 formed in a kernel of
its own (kernels/fwd_inv.py: 16 x 16 diagonal blocks inverted, then merged), which the chunk
prep then loads. o, final state and every gradient against the float64 token recurrence
(packed documents cutting chunks inside each 16-row block, an empty and a 1-token one; GQA
with two q/k heads; kept and recomputed T; fp32 and 16-bit); T itself against
``torch.linalg.inv`` of the float64 A_raw; close to ``inv_kernel = 0`` and bitwise
repeatable; the kernel runs once per forward and once more only in a backward that
recomputes T; the fields serialised."""

import dataclasses
import json

import pytest
import torch
from cake_core.testing import assert_bitwise_repeat, assert_close_to_reference, randn
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    GDNDetPlan,
    chunk_gated_delta_rule_det,
    chunk_gdn_det_bwd,
    chunk_gdn_det_fwd,
    gdn_reference,
    make_plan,
)

DEV = default_device()
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                        device=DEV)


def _grads(fn, inputs, h0, do, dht, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    s = h0.detach().clone().requires_grad_()
    o, ht = fn(*leaves, initial_state=s, output_final_state=True, **kw)
    torch.autograd.backward([o, ht], [do.to(o.dtype), dht.to(ht.dtype)])
    return [o, ht] + [t.grad for t in leaves] + [s.grad]


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), inv_kernel=1, **over)


@pytest.mark.parametrize("K, V, H, HV, dtype, lens, over", [
    (32, 32, 1, 2, torch.float32, [1, 81, 33, 49], {}),
    (48, 40, 2, 4, torch.float32, [1, 70, 0, 65], dict(keep_a=0)),
    (64, 48, 2, 2, torch.bfloat16, [1, 81, 33, 49], {}),
    (32, 32, 1, 2, torch.float16, [1, 70, 0, 65], dict(keep_a=0, num_warps_inv=4)),
], ids=["fp32-tails-in-each-block", "fp32-gqa-recompute", "bf16-hv1", "fp16-recompute"])
def test_inv_kernel_vs_reference(K, V, H, HV, dtype, lens, over, gdn_inputs):
    plan = _plan(K, V, dtype, **over)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), H, HV, K, V, dtype, seed=121,
                                      g_mode="strong", n_states=len(lens), h0=True)
    cu = _cu(lens)
    do = randn(v.shape, dtype, DEV, seed=122)
    dht = randn(h0.shape, torch.float32, DEV, seed=123)
    got = _grads(chunk_gated_delta_rule_det, (q, k, v, g, beta), h0, do, dht,
                 cu_seqlens=cu, plan=plan)
    want = _grads(lambda *a, **kw: gdn_reference(*a, **kw, dtype=torch.float64),
                  [t.double() for t in (q, k, v, g, beta)], h0.double(), do.double(),
                  dht.double(), cu_seqlens=cu)
    # CUDA's fp32 dots are tf32x3, not IEEE: with decays down to -20 per token an H200 gave
    # dg 1.66e-5 (relative Frobenius) at fp32-tails-in-each-block, inv_kernel 0 (the rule)
    # and 1 alike (session 23), as test_gdn_grads.test_decay_regimes allows
    tol = 1e-4 if DEV.type == "cuda" and dtype == torch.float32 else None
    for name, a, b in zip(("o", "final_state") + tuple("d" + n for n in NAMES), got, want,
                          strict=True):
        assert_close_to_reference(a, b, dtype, name, tol=tol)


def test_saved_t_is_the_inverse(gdn_inputs):
    """The T the forward keeps (fp32 plan) against ``torch.linalg.inv`` of the float64
    A_raw of each chunk, for documents whose last chunk ends inside each 16-row block;
    rows past a chunk's end are never read (not compared)."""
    K, V, H, HV = 32, 16, 2, 4
    lens = [1, 81, 33, 49, 64]
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), H, HV, K, V, seed=124, g_mode="strong",
                                      n_states=len(lens), h0=True)
    plan = _plan(K, V, torch.float32, store_16bit=0)
    _, _, saved = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, cu_seqlens=_cu(lens),
                                    plan=plan)
    A = saved.A.double()
    starts = 0
    for n in lens:
        for c0 in range(0, n, 64):
            s0, e0 = starts + c0, starts + min(c0 + 64, n)
            L = e0 - s0
            for hv in range(HV):
                kk = k[0, s0:e0, hv // (HV // H)].double()
                gc = g[0, s0:e0, hv].double().cumsum(0)
                b = beta[0, s0:e0, hv].double()
                a = torch.tril(b[:, None] * (kk @ kk.T) * torch.exp(gc[:, None] - gc[None, :]),
                               -1)
                t = torch.linalg.inv(torch.eye(L, dtype=torch.float64) + a.cpu())
                got = A[s0:e0, hv, :L].cpu()
                torch.testing.assert_close(got, t, rtol=1e-4, atol=1e-5)
                assert not A[s0:e0, hv, L:].cpu().any()  # upper blocks past the tail: zero
        starts += n


def _fwd_bwd(inputs, h0, cu, do, dht, plan):
    o, ht, saved = chunk_gdn_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=plan)
    return (o, ht, saved.A, *chunk_gdn_det_bwd(do, dht, saved))


@pytest.mark.parametrize("keep_a", [1, 0])
def test_inv_kernel_repeats_and_is_close_to_the_prep_inverse(keep_a, gdn_inputs):
    K, V = 40, 32
    lens = [1, 70, 0, 65]
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), 1, 2, K, V, seed=125, g_mode="strong",
                                      n_states=len(lens), h0=True)
    cu = _cu(lens)
    do = randn(v.shape, torch.float32, DEV, seed=126)
    dht = randn(h0.shape, torch.float32, DEV, seed=127)
    base = dataclasses.replace(make_plan(K, V, torch.float32, DEV), keep_a=keep_a)
    new = dataclasses.replace(base, inv_kernel=1)
    got = assert_bitwise_repeat(lambda: _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, new),
                                repeats=2)
    want = _fwd_bwd((q, k, v, g, beta), h0, cu, do, dht, base)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"output {i}")


@pytest.mark.parametrize("keep_a, n_bwd", [(1, 0), (0, 1)])
def test_inv_kernel_launches(keep_a, n_bwd, monkeypatch, gdn_inputs):
    """Once per forward; in the backward only when it recomputes T (keep_a = 0); never with
    inv_kernel = 0."""
    import cake_gdn_det_train.api as api

    calls = []

    class Spy:
        def __getitem__(self, grid):
            calls.append(tuple(grid))
            return real[grid]

    real = api.gdn_fwd_inv_kernel
    monkeypatch.setattr(api, "gdn_fwd_inv_kernel", Spy())
    q, k, v, g, beta, h0 = gdn_inputs(1, 70, 1, 2, 16, 16, seed=128, h0=True)
    for inv in (0, 1):
        calls.clear()
        plan = dataclasses.replace(make_plan(16, 16, torch.float32, DEV), inv_kernel=inv,
                                   keep_a=keep_a)
        o, _ = chunk_gated_delta_rule_det(q.clone().requires_grad_(), k, v, g, beta, plan=plan)
        assert len(calls) == inv, calls
        o.sum().backward()
        assert len(calls) == inv * (1 + n_bwd), calls
    assert calls[0] == (2, 2)  # (chunks, value heads)


def test_fields_serialised_and_checked():
    for dev in ("cpu", "cuda"):
        for K, V, dt in ((16, 16, torch.float32), (128, 128, torch.bfloat16)):
            p = make_plan(K, V, dt, dev)
            assert (p.inv_kernel, p.num_warps_inv) == (0, 2), (dev, K, V, dt)
    plan = make_plan(128, 128, torch.bfloat16, DEV)
    on = dataclasses.replace(plan, inv_kernel=1, num_warps_inv=1)
    d = on.to_dict()
    assert d["inv_kernel"] == 1 and d["num_warps_inv"] == 1 and d["version"] == 1
    assert GDNDetPlan.from_dict(json.loads(on.to_json())) == on and on.key != plan.key
    for name, bad in (("inv_kernel", 2), ("inv_kernel", -1), ("num_warps_inv", 3)):
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(plan, **{name: bad})
