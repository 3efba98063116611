"""``plan.keep_aqk = 1``: the forward keeps each chunk's gated ``q k^T`` (Aqk) beside T,
stacked as the saved ``A`` ``[2, B * T, HV, 64]``, and the backward launches neither pairs
kernel. o, final state and every gradient against the float64 reference (packed documents
with an empty and a 1-token one, strong decays); the same bits as ``keep_aqk = 0`` (the same
kernels on the same inputs), on the low-level pair, the autograd entry and the custom ops
under ``torch.compile``; a backward whose plan does not load Aqk recomputes it (same bits);
the saved Aqk is not written by the backward; the field serialised (format version 8), a
format-7 dict refused, and the combinations it needs checked."""

import dataclasses

import cake_kda_det_train.api as api
import pytest
import torch
from cake_core.testing import assert_compile_same_bits, bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, chunk_kda_det, chunk_kda_det_bwd, chunk_kda_det_fwd

DEV = default_device()
LENS = [1, 70, 0, 65]
PAIRS = ("kda_fwd_pairs_kernel", "kda_fwd_pairs_tok_kernel")


def _plan(K, V, dtype, **over):
    base = api.make_plan(K, V, dtype, DEV)
    if DEV.type == "cpu":  # the loop diagonals: the token-parallel kernels cost minutes here
        base = dataclasses.replace(base, pairs_diag=1, bwd_diag=0)
    return dataclasses.replace(base, keep_aqk=1, **over)


def _case(kda, K=24, V=16, dtype=torch.float32, seed=111):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, dtype, seed=seed,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    do = randn(v.shape, dtype, DEV, seed=seed + 1)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 2)
    return (q, k, v, g, beta), h0, kda.cu_of(LENS), do, dht


@pytest.mark.parametrize("K, V, dtype, over", [
    (24, 16, torch.float32, dict(block_k_inner=16)),
    (32, 32, torch.bfloat16, dict(block_k_inner=16)),
], ids=["fp32", "bf16"])
def test_keep_aqk_vs_reference(K, V, dtype, over, kda):
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, dtype, seed=113,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    kda.check_vs_reference((q, k, v, g, beta), h0, dtype=dtype, seed=113,
                           cu_seqlens=kda.cu_of(LENS), plan=plan,
                           grad_tol=3e-5 if dtype == torch.float32 else None)


def test_keep_aqk_same_bits_as_recompute_and_skips_pairs(kda, monkeypatch):
    """The low-level pair: the same bits as ``keep_aqk = 0``; the backward launches no pairs
    kernel (the forward does); the saved stack holds T (the ``keep_aqk = 0`` forward's) and
    is left as the forward wrote it."""
    inputs, h0, cu, do, dht = _case(kda)
    on = _plan(24, 16, torch.float32)
    off = dataclasses.replace(on, keep_aqk=0)
    want = kda.fwd_bwd_saved(inputs, h0, cu, do, dht, off)
    calls = {n: kda.spy_launches(monkeypatch, n) for n in PAIRS}
    o, ht, saved = chunk_kda_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=on)
    n_fwd = {n: len(c) for n, c in calls.items()}
    assert n_fwd["kda_fwd_pairs_kernel"] == 1
    NT = inputs[0].shape[1]
    assert saved.A.shape == (2, NT, 2, 64)
    before = saved.A.clone()
    grads = chunk_kda_det_bwd(do, dht, saved)
    assert {n: len(c) for n, c in calls.items()} == n_fwd  # nothing launched by the backward
    assert bitwise_equal(saved.A, before)
    got = (o, ht, saved.g_cumsum, saved.A[0], *grads)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        assert a is None or bitwise_equal(a, b), i


def test_backward_plan_without_keep_aqk_recomputes(kda, monkeypatch):
    """A saved stack given to a backward whose plan keeps T only (or nothing): recomputed,
    the same bits."""
    inputs, h0, cu, do, dht = _case(kda, seed=117)
    on = _plan(24, 16, torch.float32)
    o, ht, saved = chunk_kda_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=on)
    want = chunk_kda_det_bwd(do, dht, saved)
    calls = kda.spy_launches(monkeypatch, "kda_fwd_pairs_kernel")
    for other in (dataclasses.replace(on, keep_aqk=0), dataclasses.replace(on, keep_aqk=0,
                                                                           keep_a=0)):
        calls.clear()
        got = chunk_kda_det_bwd(do, dht, saved, plan=other)
        assert len(calls) == 1
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert (a is None) == (b is None), i
            assert a is None or bitwise_equal(a, b), i


def test_keep_aqk_autograd_and_compiled_same_bits(kda):
    """The autograd entry (eager) and the custom ops under ``torch.compile(fullgraph=True)``
    (the fake forward's stacked A): the bits of ``keep_aqk = 0``."""
    inputs, h0, cu, _, _ = _case(kda, seed=119)
    on = _plan(24, 16, torch.float32)
    off = dataclasses.replace(on, keep_aqk=0)

    def step(plan):
        def f(q, k, v, g, beta, h0):
            o, ht = chunk_kda_det(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  cu_seqlens=cu, plan=plan)
            # no reduction: inductor may fuse a sum in another order than eager (a sum of
            # o * o and ht * ht differed on an H200, session 19); cat is exact
            return torch.cat((o.flatten(), ht.flatten()))
        return f

    def grads(f):
        xs = [t.detach().clone().requires_grad_() for t in (*inputs, h0)]
        out = f(*xs)
        out.backward(torch.cos(out.detach()))
        return [x.grad for x in xs]

    for a, b in zip(grads(step(on)), grads(step(off)), strict=True):
        assert bitwise_equal(a, b)
    torch._dynamo.reset()
    backend = "aot_eager" if DEV.type == "cpu" else "inductor"
    assert_compile_same_bits(step(on), (*inputs, h0), backend)


def test_keep_aqk_field_serialised_and_checked():
    on = api.make_plan(128, 128, torch.bfloat16, DEV)
    assert on.keep_aqk == 1  # the rule keeps Aqk (session 19, checked on an H200)
    plan = dataclasses.replace(on, keep_aqk=0)
    d = on.to_dict()
    assert d["keep_aqk"] == 1 and d["version"] == KDADetPlan.format_version == 1
    assert KDADetPlan.from_dict(d) == on and on.key != plan.key
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="keep_aqk"):
            dataclasses.replace(plan, keep_aqk=bad)
    for over in (dict(keep_a=0), dict(fwd_split=0)):
        with pytest.raises(ValueError, match="keep_aqk=1 needs keep_a=1 and fwd_split=1"):
            dataclasses.replace(on, **over)


def test_plan_variant_turns_keep_aqk_off_with_what_it_needs():
    """``plan_variant`` (the benchmark's and GPU tools' overrides): keep_a = 0 or fwd_split =
    0 also turns keep_aqk off unless named; naming it keeps the plan's own check."""
    from cake_kda_det_train.plan import plan_variant
    rule = api.make_plan(64, 64, torch.bfloat16, DEV)
    assert plan_variant(rule) == rule and plan_variant(rule, block_v=32).keep_aqk == 1
    for over in (dict(keep_a=0), dict(fwd_split=0)):
        assert plan_variant(rule, **over) == dataclasses.replace(rule, keep_aqk=0, **over)
        with pytest.raises(ValueError, match="keep_aqk=1 needs"):
            plan_variant(rule, keep_aqk=1, **over)
