"""Forward and gradients against cake-gdn-det-train's float64 token-by-token reference,
fixed-length and packed (with an empty and a one-token document); the low-level pair
against the autograd entry."""

import pytest
import torch
from _gdn_nd_cases import DEV, make_inputs
from cake_core.testing import assert_close_to_reference, bitwise_equal, randn
from cake_gdn_det_train import gdn_reference
from cake_gdn_nondet_train import (
    GDNNondetGrads,
    GDNNondetSavedSet,
    GDNNondetWorkspace,
    chunk_gated_delta_rule_nondet,
    chunk_gdn_nondet_bwd,
    chunk_gdn_nondet_fwd,
    make_nondet_plan,
)

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def _grads(fn, inputs, h0, do, dht, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    s = h0.detach().clone().requires_grad_() if h0 is not None else None
    o, ht = fn(*leaves, initial_state=s, output_final_state=True, **kw)
    torch.autograd.backward([o, ht], [do.to(o.dtype), dht])
    return o, ht, [t.grad for t in leaves] + [s.grad if s is not None else None]


def _check(inputs, h0, N, *, l2=False, cu=None, seed=0):
    q, k, v = inputs[:3]
    do = randn(v.shape, v.dtype, DEV, seed=seed + 100)
    dht = randn((N, v.shape[2], q.shape[3], v.shape[3]), torch.float32, DEV, seed=seed + 101)
    kw = {"use_qk_l2norm_in_kernel": l2, "cu_seqlens": cu}
    o, ht, got = _grads(chunk_gated_delta_rule_nondet, inputs, h0, do, dht, **kw)
    o64, ht64, want = _grads(
        lambda *a, **k: gdn_reference(*a, **k, dtype=torch.float64),
        [t.double() for t in inputs], h0.double() if h0 is not None else None, do.double(),
        dht.double(), **kw)
    assert_close_to_reference(o, o64, q.dtype, "o")
    assert_close_to_reference(ht, ht64, q.dtype, "final_state")
    for name, a, b, t in zip(NAMES, got, want, (*inputs, h0), strict=True):
        if t is None:
            assert a is None
            continue
        assert a.dtype == t.dtype and a.shape == t.shape, name
        assert_close_to_reference(a, b, q.dtype, f"d{name}")
    return o, ht, got, do, dht


def test_fixed_length_gva_with_states():
    q, k, v, g, beta, h0 = make_inputs(2, 70, 1, 2, 16, 16, seed=3, h0=True)
    _check((q, k, v, g, beta), h0, 2, seed=3)


def test_packed_with_empty_and_one_token_documents():
    lens = [0, 1, 40, 30]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEV)
    q, k, v, g, beta, h0 = make_inputs(1, sum(lens), 1, 2, 16, 16, seed=5,
                                       n_states=len(lens), h0=True)
    o, ht, got, _, dht = _check((q, k, v, g, beta), h0, len(lens), l2=True, cu=cu, seed=5)
    # the empty document hands its state (and its gradient) through unchanged
    assert bitwise_equal(ht[0], h0[0]) and bitwise_equal(got[5][0], dht[0])


def test_low_level_pair_equals_autograd_entry():
    q, k, v, g, beta, h0 = make_inputs(1, 70, 1, 2, 16, 16, seed=7, h0=True)
    o, ht, got, do, dht = _check((q, k, v, g, beta), h0, 1, seed=7)
    plan = make_nondet_plan(16, 16, q.dtype, DEV)
    ws = GDNNondetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=70)
    o2, ht2, saved = chunk_gdn_nondet_fwd(q, k, v, g, beta, initial_state=h0,
                                          output_final_state=True, plan=plan, workspace=ws)
    assert isinstance(saved, GDNNondetSavedSet) and saved.plan is plan
    gr = chunk_gdn_nondet_bwd(do, dht, saved, workspace=ws)
    assert isinstance(gr, GDNNondetGrads) and gr.dA_log is None
    for a, b in zip((o2, ht2, *gr[:6]), (o, ht, *got), strict=True):
        assert bitwise_equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_16bit_forward(dtype):
    q, k, v, g, beta, h0 = make_inputs(1, 65, 1, 2, 32, 32, dtype, seed=9, h0=True)
    o, ht, _ = chunk_gdn_nondet_fwd(q, k, v, g, beta, initial_state=h0,
                                    output_final_state=True)
    o64, ht64 = gdn_reference(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                              dtype=torch.float64)
    assert o.dtype == dtype
    assert_close_to_reference(o, o64, dtype, "o")
    assert_close_to_reference(ht, ht64, dtype, "final_state")
