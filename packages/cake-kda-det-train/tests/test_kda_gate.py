"""FLA's in-kernel KDA gate (both formulas) and beta sigmoid, kernel by kernel
(kernels/gate.py through the api's launch helpers): values and every gradient against
float64 autograd through :func:`kda_gate_ref`; dA_log / ddt_bias as fixed-order sums."""

import dataclasses

import cake_kda_det_train.api as api
import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import assert_bitwise_repeat, assert_close_to_reference, bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    kda_gate_ref,
    kda_recurrence_ref,
    make_plan,
)

DEV = default_device()
F64 = torch.float64
B, T, HV, K = 1, 40, 3, 24    # K not a power of two: masked channels; 40 tokens: a
BLOCK_T = 16                  # ragged last block of the plan's 16-token gate blocks


def _plan():
    return dataclasses.replace(make_plan(K, 16, torch.float32, DEV), gate_block_t=BLOCK_T)


def _one_token_chunks(g):
    NT = g.shape[0] * g.shape[1]
    starts = torch.arange(NT, dtype=torch.int32, device=g.device)
    return NT, starts, starts + 1


def _gate_values(g, A_log, dt_bias, lb, plan):
    """The gate of the raw g as the forward forms it (inside the chunk cumulative-sum
    kernel), read out through chunks of one token each: each sum is one gate value."""
    from cake_kda_det_train.chunk import g_cumsum_into

    NT, starts, ends = _one_token_chunks(g)
    out = torch.full((NT, g.shape[2], g.shape[3]), float("nan"), device=g.device)
    g_cumsum_into(out, g.contiguous(), starts, ends, NT, plan, (A_log, dt_bias, lb))
    return out.view(g.shape)


def _gate_grads(g, A_log, dt_bias, lb, dgate, plan):
    """``(dg, dA_log, ddt_bias)`` as the backward forms them (the gate's backward inside the
    chunk backward's dg kernel, per-chunk sums added in chunk order), through chunks of one
    token each (each reverse cumulative sum is its token's own gradient)."""
    from cake_kda_det_train.chunk import dg_cumsum_into

    NT, starts, ends = _one_token_chunks(g)
    dg = torch.full((NT, g.shape[2], g.shape[3]), float("nan"), device=g.device)
    parts = dg_cumsum_into(dg, dgate.contiguous().view(dg.shape), starts, ends, NT, plan,
                           (g.contiguous(), A_log, dt_bias, lb))
    return (dg.view(g.shape), *api._gate_param_grads(parts, A_log, dt_bias, g.shape[2],
                                                     g.shape[3], g.device))


def _raw(seed, dtype=torch.float32):
    g = 1.5 * randn((B, T, HV, K), torch.float32, DEV, seed=seed)
    g[0, 1, 0, :3] = 25.0        # above FLA's softplus threshold (20): softplus(x) = x
    g[0, 2, 1, 4] = 19.9         # just below it
    g[0, 3, 2, 5] = -30.0        # far below 0
    beta = 2.0 * randn((B, T, HV), torch.float32, DEV, seed=seed + 1)
    return g.to(dtype), beta.to(dtype)


FORMS = {
    # name: (lower_bound, has A_log, has dt_bias, beta code)
    "softplus-bias-sigmoid": (None, True, True, 1),
    "softplus-nobias-negeig": (None, True, False, 2),
    "lowerbound-A-bias": (-5.0, True, True, 1),
    "lowerbound-noA-bias": (-2.5, False, True, 0),
    "lowerbound-noA-nobias-sigmoid": (-1.0, False, False, 1),
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("pdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gate_kernels_vs_float64(form, pdtype):
    lb, has_a, has_bias, sig = FORMS[form]
    g, beta = _raw(3, pdtype)
    A_log = (0.5 * randn((HV,), torch.float32, DEV, seed=5) - 0.5).to(pdtype) if has_a else None
    dt_bias = (0.5 * randn((HV * K,), torch.float32, DEV, seed=6)).to(pdtype) \
        if has_bias else None
    plan = _plan()
    g_out = _gate_values(g, A_log, dt_bias, lb, plan)
    b_out = api._beta_fwd(beta, sig, plan)
    assert g_out.dtype == torch.float32 and g_out.shape == g.shape
    dgate = randn(g.shape, torch.float32, DEV, seed=7)
    dbp = randn(beta.shape, torch.float32, DEV, seed=8)
    dg, dA, dbias = _gate_grads(g, A_log, dt_bias, lb, dgate, plan)
    db = dbp.clone()
    api._beta_bwd(beta, db.view(-1, HV), sig, plan)
    # float64 autograd through the reference gate and FLA's beta sigmoid
    leaves = [t.detach().double().requires_grad_() if t is not None else None
              for t in (g, beta, A_log, dt_bias)]
    g64 = kda_gate_ref(leaves[0], leaves[2], leaves[3], lb)
    b64 = (sig * torch.sigmoid(leaves[1])) if sig else leaves[1]
    torch.autograd.backward([g64, b64], [dgate.double(), dbp.double()])
    tol = 1e-5
    assert_close_to_reference(g_out, g64, torch.float32, "gate", tol=tol)
    assert float(g_out.max()) <= 0.0
    if sig:
        assert_close_to_reference(b_out, b64, torch.float32, "beta'", tol=tol)
    else:
        assert b_out is beta
    assert_close_to_reference(dg, leaves[0].grad, torch.float32, "dg", tol=tol)
    assert_close_to_reference(db, leaves[1].grad, torch.float32, "dbeta", tol=tol)
    if has_a:
        assert dA.dtype == pdtype and dA.shape == (HV,)
        assert_close_to_reference(dA, leaves[2].grad, pdtype, "dA_log",
                                  tol=tol if pdtype == torch.float32 else None)
    else:
        assert dA is None
    if has_bias:
        assert dbias.dtype == pdtype and dbias.shape == (HV * K,)
        assert_close_to_reference(dbias, leaves[3].grad, pdtype, "ddt_bias",
                                  tol=tol if pdtype == torch.float32 else None)
    else:
        assert dbias is None


def test_softplus_threshold_is_flas():
    """x > 20: softplus(x) = x exactly; below, log(1 + exp(x))."""
    g = torch.tensor([25.0, 20.5, 19.9, 0.0, -30.0], device=DEV).view(1, 5, 1, 1)
    A_log = torch.zeros(1, device=DEV)  # -exp(0) = -1
    out = _gate_values(g, A_log, None, None, _plan()).flatten()
    assert out[0] == -25.0 and out[1] == -20.5
    want = -F.softplus(g.double().flatten(), threshold=20.0)
    assert_close_to_reference(out, want, torch.float32, "softplus", tol=1e-6)


def test_fixed_order_sums_and_reordering_changes_bits(monkeypatch):
    """dA_log and ddt_bias are the per-chunk partials added in chunk order (bitwise),
    repeat bitwise, and other orders (what atomics would give) change the bits on this
    input, so the repeat test can fail."""
    g, beta = _raw(11)
    A_log = 0.5 * randn((HV,), torch.float32, DEV, seed=12) - 0.5
    dt_bias = 0.5 * randn((HV * K,), torch.float32, DEV, seed=13)
    dgate = randn(g.shape, torch.float32, DEV, seed=14)
    plan = _plan()
    seen = []
    real = api.ordered_sum

    def spy(partials, **kw):
        seen.append(partials.clone())
        return real(partials, **kw)

    monkeypatch.setattr(api, "ordered_sum", spy)

    def step():
        return _gate_grads(g, A_log, dt_bias, None, dgate, plan)[1:]

    dA, dbias = assert_bitwise_repeat(step, repeats=2)
    parts_a, parts_b = seen[0], seen[1]
    assert parts_a.shape == (B * T, HV) and parts_b.shape == (B * T, HV * K)  # one a chunk
    gen = torch.Generator().manual_seed(0)
    for parts, got in ((parts_a, dA), (parts_b, dbias)):
        acc = parts[0].clone()
        for i in range(1, parts.shape[0]):
            acc = acc + parts[i]
        assert bitwise_equal(acc, got)
        differs = 0
        for _ in range(20):
            perm = torch.randperm(parts.shape[0], generator=gen).tolist()
            s = parts[perm[0]].clone()
            for i in perm[1:]:
                s = s + parts[i]
            differs += not bitwise_equal(s, got)
        assert differs > 0, "no reordering changed the bits: this input cannot detect atomics"


def test_end_to_end_sums_bitwise_and_low_level(kda):
    """Through the chunk computation (two rows: two chunks' partial sums): bf16 inputs, bf16
    A_log, fp32 dt_bias; dA_log / ddt_bias keep their dtypes and repeat bitwise (low level
    twice)."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(2, 20, 1, 2, 32, 32, torch.bfloat16, seed=21,
                                               g_mode="raw", raw_beta=True, h0=True)
    A_log, dt_bias = kda.make_gate_params(2, 32, seed=22, dtype=torch.bfloat16)
    dt_bias = dt_bias.float()
    do = randn(v.shape, torch.bfloat16, DEV, seed=23)
    opts = {"use_gate_in_kernel": True, "A_log": A_log, "dt_bias": dt_bias,
            "use_beta_sigmoid_in_kernel": True}

    def step():
        _, _, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0, **opts)
        return tuple(chunk_kda_det_bwd(do, None, saved))

    gr = api.KDADetGrads(*assert_bitwise_repeat(step, repeats=2))
    assert gr.dA_log.dtype == torch.bfloat16 and gr.ddt_bias.dtype == torch.float32
    assert gr.dg.dtype == g.dtype and gr.dbeta.dtype == beta.dtype


def test_no_tokens(kda):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(2, 0, 1, 2, 16, 16, seed=31, h0=True)
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=32)
    _, ht, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                     use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                     use_beta_sigmoid_in_kernel=True)
    assert bitwise_equal(ht, h0)
    gr = chunk_kda_det_bwd(torch.empty_like(v), None, saved)
    assert torch.equal(gr.dA_log, torch.zeros(2, device=DEV))
    assert torch.equal(gr.ddt_bias, torch.zeros(32, device=DEV))
    assert gr.dg.shape == g.shape and bitwise_equal(gr.dinitial_state, torch.zeros_like(h0))


def test_options_off_ignore_params(kda):
    """Without use_gate_in_kernel, A_log / dt_bias / lower_bound are ignored (FLA)."""
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 20, 1, 2, 16, 16, seed=41)
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=42)
    o1, _, saved = chunk_kda_det_fwd(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias,
                                     lower_bound=-2.0)
    o2, _, _ = chunk_kda_det_fwd(q, k, v, g, beta)
    assert bitwise_equal(o1, o2)
    assert saved.A_log is None and saved.dt_bias is None and saved.lower_bound is None
    gr = chunk_kda_det_bwd(torch.ones_like(o1), None, saved)
    assert gr.dA_log is None and gr.ddt_bias is None and gr.dinitial_state is None


def test_reference_gate_formulas():
    """kda_gate_ref against FLA's formulas written out (fla/ops/kda/gate.py)."""
    g = randn((2, 5, 3, 4), F64, seed=51)
    A_log = randn((3,), F64, seed=52)
    dt = randn((12,), F64, seed=53)
    x = g + dt.view(3, 4)
    a = A_log.exp().view(3, 1)
    assert torch.allclose(kda_gate_ref(g, A_log, dt), -a * torch.log1p(torch.exp(x)),
                          rtol=1e-12, atol=0)
    assert torch.allclose(kda_gate_ref(g, A_log, dt, -5.0), -5.0 * torch.sigmoid(a * x),
                          rtol=1e-12, atol=0)
    assert torch.equal(kda_gate_ref(g, None, None, -5.0), -5.0 * torch.sigmoid(g))
    with pytest.raises(ValueError, match="A_log"):
        kda_gate_ref(g)
    # the recurrence with the in-kernel gate equals the recurrence on the computed decay
    q, k = randn((1, 5, 1, 4), F64, seed=54), randn((1, 5, 1, 4), F64, seed=55)
    v, beta = randn((1, 5, 3, 2), F64, seed=56), randn((1, 5, 3), F64, seed=57).sigmoid()
    gg = g[:1]
    a1, _ = kda_recurrence_ref(q, k, v, gg, beta, use_gate_in_kernel=True, A_log=A_log,
                               dt_bias=dt, lower_bound=-2.0)
    a2, _ = kda_recurrence_ref(q, k, v, kda_gate_ref(gg, A_log, dt, -2.0), beta)
    assert torch.equal(a1, a2)
