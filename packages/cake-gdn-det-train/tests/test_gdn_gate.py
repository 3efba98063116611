"""FLA's in-kernel gate (use_gate_in_kernel, A_log, dt_bias) and beta sigmoid
(use_beta_sigmoid_in_kernel): o, final state and every gradient (raw dg, pre-sigmoid dbeta,
dA_log, ddt_bias) against float64 autograd through the reference; fixed-order sums."""

import dataclasses

import cake_gdn_det_train.api as api
import pytest
import torch
from cake_core.testing import assert_bitwise_repeat, assert_close_to_reference, bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    chunk_gated_delta_rule_det,
    chunk_gdn_det_bwd,
    chunk_gdn_det_fwd,
    gdn_reference,
    make_plan,
)
from cake_gdn_det_train.reference import gdn_gate_reference

DEV = default_device()
NAMES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")


def _gate_inputs(gdn_inputs, B, T, H, HV, K, V, *, seed, dtype=torch.float32, bias=True,
                 n_states=None, h0=True, big=False, param_dtype=torch.float32):
    """Raw gate (about N(0, 1.5^2)), pre-sigmoid beta, A_log and dt_bias of ``[HV]``."""
    q, k, v, _, _, state = gdn_inputs(B, T, H, HV, K, V, dtype, seed=seed, n_states=n_states,
                                      h0=h0)
    g = 1.5 * randn((B, T, HV), torch.float32, DEV, seed=seed + 10)
    if big and T > 3:  # across FLA's softplus threshold (20) and far below 0
        g[0, 1, 0], g[0, 2, -1], g[0, 3, 0] = 25.0, -30.0, 19.5
    beta = 2.0 * randn((B, T, HV), torch.float32, DEV, seed=seed + 11)
    A_log = (0.5 * randn((HV,), torch.float32, DEV, seed=seed + 12) - 0.5).to(param_dtype)
    dt_bias = (0.5 * randn((HV,), torch.float32, DEV, seed=seed + 13)).to(param_dtype) \
        if bias else None
    return (q, k, v, g, beta), state, A_log, dt_bias


def _run(fn, inputs, h0, A_log, dt_bias, do, dht, *, gate=True, sig=True, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    extra = [t.detach().clone().requires_grad_() if t is not None else None
             for t in (h0, A_log, dt_bias)]
    o, ht = fn(*leaves, initial_state=extra[0], output_final_state=dht is not None,
               use_gate_in_kernel=gate, A_log=extra[1], dt_bias=extra[2],
               use_beta_sigmoid_in_kernel=sig, **kw)
    outs, gs = [o], [do.to(o.dtype)]
    if dht is not None:
        outs.append(ht)
        gs.append(dht.to(ht.dtype))
    torch.autograd.backward(outs, gs)
    return o, ht, [t.grad for t in leaves] + [t.grad if t is not None else None for t in extra]


def _check(inputs, h0, A_log, dt_bias, *, dtype=torch.float32, cu=None, gate=True, sig=True,
           seed=0):
    q, k, v, g, beta = inputs
    N = q.shape[0] if cu is None else cu.numel() - 1
    do = randn(v.shape, dtype, DEV, seed=seed + 100)
    dht = randn((N, v.shape[2], q.shape[3], v.shape[3]), torch.float32, DEV, seed=seed + 101)
    kw = {"cu_seqlens": cu, "gate": gate, "sig": sig}
    o, ht, got = _run(chunk_gated_delta_rule_det, inputs, h0, A_log, dt_bias, do, dht, **kw)

    def ref(*a, **k):
        return gdn_reference(*a, **k, dtype=torch.float64)

    d64 = [t.double() if t is not None else None for t in (h0, A_log, dt_bias)]
    o_r, ht_r, want = _run(ref, [t.double() for t in inputs], *d64, do.double(), dht.double(),
                           **kw)
    assert_close_to_reference(o, o_r, dtype, "o")
    assert_close_to_reference(ht, ht_r, torch.float32, "final_state")
    params = (*inputs, h0, A_log if gate else None, dt_bias if gate else None)
    for name, a, b, t in zip(NAMES, got, want, params, strict=True):
        if t is None:
            assert a is None, name
            continue
        assert a.dtype == t.dtype and a.shape == t.shape, name
        assert_close_to_reference(a, b, dtype, f"d{name}")
    return got


def test_fixed_length_hv_2h_gate_bias_and_sigmoid(gdn_inputs):
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 2, 70, 1, 2, 16, 16, seed=201,
                                              big=True)
    _check(inputs, h0, A_log, dt_bias, seed=201)


def test_packed_no_bias(gdn_inputs):
    lens = [0, 1, 65, 30]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64,
                      device=DEV)
    inputs, h0, A_log, _ = _gate_inputs(gdn_inputs, 1, sum(lens), 1, 2, 16, 16, seed=203,
                                        bias=False, n_states=4)
    _check(inputs, h0, A_log, None, cu=cu, seed=203)


@pytest.mark.parametrize("gate,sig", [(True, False), (False, True)])
def test_one_option_alone(gate, sig, gdn_inputs):
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 1, 40, 2, 4, 16, 16, seed=207)
    if not sig:  # beta given post-sigmoid
        inputs = (*inputs[:4], torch.sigmoid(inputs[4]))
    _check(inputs, h0, A_log, dt_bias, gate=gate, sig=sig, seed=207)


def test_low_level_bitwise_and_ordered_sums(gdn_inputs, monkeypatch):
    """bf16 inputs, bf16 A_log, fp32 dt_bias: dA_log / ddt_bias repeat bitwise, equal the
    autograd path and are the per-block partials added in index order."""
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 1, 100, 1, 2, 16, 16, seed=211,
                                              dtype=torch.bfloat16, param_dtype=torch.bfloat16)
    dt_bias = dt_bias.float()
    do = randn(inputs[2].shape, torch.bfloat16, DEV, seed=212)
    plan = dataclasses.replace(make_plan(16, 16, torch.bfloat16, DEV), gate_block_t=16)
    opts = {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias,
            "use_beta_sigmoid_in_kernel": True, "plan": plan}
    seen = []
    real = api.ordered_sum

    def spy(partials, **kw):
        seen.append(partials.clone())
        return real(partials, **kw)

    monkeypatch.setattr(api, "ordered_sum", spy)

    def step():
        _, _, saved = chunk_gdn_det_fwd(*inputs, initial_state=h0, **opts)
        return tuple(chunk_gdn_det_bwd(do, None, saved))

    first = api.GDNDetGrads(*assert_bitwise_repeat(step, repeats=2))
    assert first.dA_log.dtype == torch.bfloat16 and first.ddt_bias.dtype == torch.float32
    parts_a, parts_b = seen[0], seen[1]
    assert parts_a.shape == (7, 2)  # 100 tokens in blocks of 16 (the plan's gate_block_t)
    for parts, got in ((parts_a, first.dA_log), (parts_b, first.ddt_bias)):
        acc = parts[0].clone()
        for i in range(1, parts.shape[0]):
            acc = acc + parts[i]
        assert bitwise_equal(acc.to(got.dtype), got)
    _, _, auto = _run(chunk_gated_delta_rule_det, inputs, h0, A_log, dt_bias, do, None,
                      plan=plan)
    for a, b in zip(first, auto, strict=True):
        assert bitwise_equal(a, b)


def test_no_tokens(gdn_inputs):
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 2, 0, 1, 2, 16, 16, seed=213)
    _, _, saved = chunk_gdn_det_fwd(*inputs, initial_state=h0, use_gate_in_kernel=True,
                                    A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    grads = chunk_gdn_det_bwd(torch.empty_like(inputs[2]), None, saved)
    assert torch.equal(grads.dA_log, torch.zeros(2, device=DEV))
    assert torch.equal(grads.ddt_bias, torch.zeros(2, device=DEV))
    assert grads.dg.shape == inputs[3].shape


def test_options_off_ignore_params_and_reference_gate(gdn_inputs):
    """Without the flags A_log / dt_bias are ignored (FLA); the reference's gate equals the
    plain reference on the precomputed log-decay."""
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 1, 20, 1, 2, 16, 16, seed=217)
    q, k, v, g, beta = inputs
    beta = beta.sigmoid()
    o1, _, saved = chunk_gdn_det_fwd(q, k, v, -g.abs(), beta, A_log=A_log, dt_bias=dt_bias)
    o2, _, _ = chunk_gdn_det_fwd(q, k, v, -g.abs(), beta)
    assert bitwise_equal(o1, o2) and saved.A_log is None and not saved.use_gate_in_kernel
    grads = chunk_gdn_det_bwd(torch.ones_like(o1), None, saved)
    assert grads.dA_log is None and grads.ddt_bias is None and grads.dinitial_state is None
    d = [t.double() for t in (q, k, v, g, beta)]
    gd = gdn_gate_reference(d[3], A_log.double(), dt_bias.double())
    want = -torch.exp(A_log.double()) * torch.log1p(torch.exp(d[3] + dt_bias.double()))
    assert torch.allclose(gd, want, rtol=1e-12, atol=0)
    a, _ = gdn_reference(*d, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    b, _ = gdn_reference(d[0], d[1], d[2], gd, d[4])
    assert torch.equal(a, b)


def test_allow_neg_eigval(gdn_inputs):
    # FLA's allow_neg_eigval: beta' = 2 sigmoid(beta) (needs the in-kernel sigmoid); every
    # gradient against float64, packed, with the gate
    inputs, h0, A_log, dt_bias = _gate_inputs(gdn_inputs, 1, 90, 1, 2, 16, 16, seed=301,
                                              n_states=2)
    cu = torch.tensor([0, 37, 90], dtype=torch.int32, device=DEV)
    q, k, v, g, beta = inputs
    do = randn(v.shape, torch.float32, DEV, seed=302)
    dht = randn(h0.shape, torch.float32, DEV, seed=303)
    kw = {"cu_seqlens": cu, "allow_neg_eigval": True}
    o, ht, got = _run(chunk_gated_delta_rule_det, inputs, h0, A_log, dt_bias, do, dht, **kw)
    _, _, plain = _run(chunk_gated_delta_rule_det, inputs, h0, A_log, dt_bias, do, dht,
                       cu_seqlens=cu)
    assert not bitwise_equal(got[4], plain[4])  # the flag changes the math

    def ref(*a, **k):
        return gdn_reference(*a, **k, dtype=torch.float64)

    d64 = [t.double() for t in (h0, A_log, dt_bias)]
    o_r, ht_r, want = _run(ref, [t.double() for t in inputs], *d64, do.double(),
                           dht.double(), **kw)
    assert_close_to_reference(o, o_r, torch.float32, "o")
    assert_close_to_reference(ht, ht_r, torch.float32, "final_state")
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert_close_to_reference(a, b, torch.float32, f"d{name}")
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires"):
        chunk_gated_delta_rule_det(q, k, v, g, beta, allow_neg_eigval=True)
