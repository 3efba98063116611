"""Parity with the float64 reference: y, dx, dz, dweight, both gate orders, groups, dtypes,
both gates (SiLU, sigmoid)."""

import dataclasses

import pytest
import torch
from cake_core.testing import TOLERANCES, assert_close_to_reference, poison_, rel_fro_error
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetWorkspace,
    make_plan,
    rmsnorm_silu_gate_det,
    rmsnorm_silu_gate_det_bwd,
    rmsnorm_silu_gate_det_fwd,
)

DEV = default_device()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _run(x, z, w, dy, eps=1e-6, **kw):
    x, z, w = (t.detach().clone().requires_grad_() for t in (x, z, w))
    y = rmsnorm_silu_gate_det(x, z, w, eps, **kw)
    y.backward(dy)
    return y, x.grad, z.grad, w.grad


def _check(got, want, dtype):
    for name, a, r in zip(("y", "dx", "dz", "dweight"), got, want, strict=True):
        assert_close_to_reference(a, r, dtype, name)


@pytest.mark.parametrize("group_size", [None, 32], ids=["row", "groups"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["fla", "mamba"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity(dtype, norm_before_gate, group_size, make_inputs, reference_grads):
    # 150 rows: 3 forward tiles of 64 (the last partial), 3 blocks over 4 backward programs
    x, z, w, dy = make_inputs((3, 50, 96), dtype, seed=7)
    kw = dict(norm_before_gate=norm_before_gate, group_size=group_size)
    got = _run(x, z, w, dy, **kw)
    assert got[0].shape == x.shape and got[0].dtype == dtype
    assert got[1].dtype == got[2].dtype == dtype and got[3].dtype == dtype
    _check(got, reference_grads(x, z, w, dy, **kw), dtype)


@pytest.mark.parametrize("norm_before_gate,group_size", [(True, None), (False, 32), (True, 24)],
                         ids=["fla", "mamba-groups", "fla-groups"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity_sigmoid_gate(dtype, norm_before_gate, group_size, make_inputs, reference_grads):
    """activation="sigmoid" (Kimi Delta Attention's output norm): gate = sigmoid(z),
    d gate / dz = s (1 - s); 75 rows over 2 forward tiles and 4 backward programs."""
    x, z, w, dy = make_inputs((3, 25, 96), dtype, seed=17)
    kw = dict(norm_before_gate=norm_before_gate, group_size=group_size, activation="sigmoid")
    got = _run(x, z, w, dy, 1e-5, **kw)
    assert got[0].dtype == got[1].dtype == got[2].dtype == got[3].dtype == dtype
    want = reference_grads(x, z, w, dy, 1e-5, **kw)
    _check(got, want, dtype)
    silu = reference_grads(x, z, w, dy, 1e-5, **{**kw, "activation": "silu"})
    assert rel_fro_error(got[0], silu[0]) > 0.1  # the sigmoid gate is a different function


def test_activation_spellings_and_gates_differ(make_inputs):
    """"swish" is "silu" (FLA's two names), bit for bit; "sigmoid" is another gate."""
    x, z, w, dy = make_inputs((21, 64), torch.float32, seed=19)
    silu = _run(x, z, w, dy, activation="silu")
    for a, b in zip(_run(x, z, w, dy), silu, strict=True):  # the default is silu
        assert torch.equal(a, b)
    for a, b in zip(_run(x, z, w, dy, activation="swish"), silu, strict=True):
        assert torch.equal(a, b)
    sig = _run(x, z, w, dy, activation="sigmoid")
    assert not any(torch.equal(a, b) for a, b in zip(sig, silu, strict=True))


@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["fla", "mamba"])
def test_parity_small_tiles_padded_groups_fp32_weight(norm_before_gate, make_inputs,
                                                      reference_grads):
    """Many row blocks per program, padded groups (D=96 as 2 groups of 48 -> 2x64 tile),
    an fp32 weight with bf16 activations, eps 1e-5."""
    D, G = 96, 48
    x, z, w, dy = make_inputs((37, D), torch.bfloat16, seed=3, w_dtype=torch.float32)
    plan = dataclasses.replace(make_plan(D, torch.bfloat16, DEV, group_size=G),
                               block_m_fwd=4, block_m_bwd=2, bwd_programs=3, reduce_block=32)
    kw = dict(norm_before_gate=norm_before_gate, group_size=G)
    got = _run(x, z, w, dy, 1e-5, plan=plan, **kw)
    assert got[3].dtype == torch.float32
    _check(got, reference_grads(x, z, w, dy, 1e-5, **kw), torch.bfloat16)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["fla", "mamba"])
def test_large_gate_magnitude_is_finite_and_right(norm_before_gate, activation, make_inputs,
                                                  reference_grads):
    """z = +-30 (and +-88 where exp(+z) overflows fp32): no inf/NaN in y or any gradient,
    for both gates."""
    x, _, w, dy = make_inputs((24, 64), torch.float32, seed=11)
    sign = torch.where(torch.arange(24 * 64, device=DEV).reshape(24, 64) % 3 == 0, 1.0, -1.0)
    z = 30.0 * sign
    z[::4] = 88.0 * sign[::4]
    z[1] = -30.0  # a whole row gated to about -1e-12 (Mamba order: eps dominates)
    kw = dict(norm_before_gate=norm_before_gate, activation=activation)
    got = _run(x, z, w, dy, **kw)
    for t in got:
        assert torch.isfinite(t).all()
    _check(got, reference_grads(x, z, w, dy, **kw), torch.float32)
    bf = [t.to(torch.bfloat16) for t in (x, z, w, dy)]
    for t in _run(*bf, **kw):
        assert torch.isfinite(t.float()).all()


def test_zero_rows(make_inputs):
    x, z, w, dy = make_inputs((0, 3, 32), torch.float32)
    y, dx, dz, dw = _run(x, z, w, dy)
    assert y.shape == x.shape and dx.shape == x.shape and dz.shape == z.shape
    assert torch.equal(dw, torch.zeros_like(w))
    acc = torch.ones(32, device=DEV)
    _, saved = rmsnorm_silu_gate_det_fwd(x, z, w)
    g = rmsnorm_silu_gate_det_bwd(dy, saved, dweight_accumulator=acc)
    assert g.dweight is None and torch.equal(acc, torch.ones(32, device=DEV))


def test_one_column_rows(make_inputs, reference_grads):
    # eps of the order of x**2: with a tiny eps a 1-wide row normalizes to +-1 and the
    # true dx is a cancellation down to eps's size
    x, z, w, dy = make_inputs((9, 1), torch.float32, seed=2)
    for nbg in (True, False):
        _check(_run(x, z, w, dy, 0.5, norm_before_gate=nbg),
               reference_grads(x, z, w, dy, 0.5, norm_before_gate=nbg), torch.float32)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_low_level_matches_autograd_bitwise(activation, make_inputs):
    x, z, w, dy = make_inputs((33, 80), torch.float32, seed=13)
    for nbg in (True, False):
        y, saved = rmsnorm_silu_gate_det_fwd(x, z, w, norm_before_gate=nbg, group_size=40,
                                             activation=activation)
        assert saved.rstd.shape == (33, 2) and saved.rstd.dtype == torch.float32
        assert saved.activation == activation
        g = rmsnorm_silu_gate_det_bwd(dy, saved)  # the forward's gate
        y2, dx2, dz2, dw2 = _run(x, z, w, dy, norm_before_gate=nbg, group_size=40,
                                 activation=activation)
        assert torch.equal(y, y2) and torch.equal(g.dx, dx2) and torch.equal(g.dz, dz2)
        assert torch.equal(g.dweight, dw2)


def test_outputs_and_workspace_are_fully_written(monkeypatch, make_inputs):
    """Poison every buffer the entry allocates, and the workspace: a skipped element would
    stay NaN."""
    import cake_rmsnorm_silu_gate_det_train.api as api

    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(api.torch, "empty", poisoned_empty)
    x, z, w, dy = make_inputs((45, 100), torch.float16, seed=21)
    plan = dataclasses.replace(make_plan(100, torch.float16, DEV, group_size=25),
                               block_m_bwd=8, bwd_programs=9)  # program 8 owns no block
    ws = RMSNormSiluGateDetWorkspace.for_plan(plan, DEV)
    for nbg in (True, False):
        poison_(ws["partials"])
        got = _run(x, z, w, dy, norm_before_gate=nbg, group_size=25, plan=plan, workspace=ws)
        for t in got:
            assert torch.isfinite(t.float()).all()
        assert torch.isfinite(ws["partials"]).all()


def test_dweight_accumulator_adds_in_fixed_order(make_inputs, reference_grads):
    D = 96
    x, z, w, dy = make_inputs((70, D), torch.bfloat16, seed=31)
    main_grad = torch.randn(D, generator=torch.Generator().manual_seed(34)).to(DEV)
    start = main_grad.clone()
    xx, zz, ww = (t.clone().requires_grad_() for t in (x, z, w))
    rmsnorm_silu_gate_det(xx, zz, ww, dweight_accumulator=main_grad,
                          norm_before_gate=False).backward(dy)
    assert ww.grad is None and xx.grad is not None and zz.grad is not None
    # fp32 weight: dweight is the very fp32 ordered sum the accumulator received
    _, _, _, dw32 = _run(x, z, w.float(), dy, norm_before_gate=False)
    assert torch.equal(main_grad, start + dw32)
    _, _, _, dw64 = reference_grads(x, z, w, dy, norm_before_gate=False)
    assert rel_fro_error(main_grad - start, dw64) < TOLERANCES[torch.bfloat16]
    # low level: returns None for dweight and adds again, in the same order
    _, saved = rmsnorm_silu_gate_det_fwd(x, z, w, norm_before_gate=False)
    before = main_grad.clone()
    g = rmsnorm_silu_gate_det_bwd(dy, saved, dweight_accumulator=main_grad)
    assert g.dweight is None and torch.equal(main_grad, before + dw32)


@pytest.mark.parametrize("bad", ["shape", "dtype", "strided"])
def test_dweight_accumulator_refused(bad, make_inputs):
    x, z, w, dy = make_inputs((5, 16), torch.float32)
    acc = {"shape": torch.zeros(15, device=DEV),
           "dtype": torch.zeros(16, device=DEV, dtype=torch.float64),
           "strided": torch.zeros(32, device=DEV)[::2]}[bad]
    with pytest.raises(ValueError, match="dweight_accumulator"):
        rmsnorm_silu_gate_det(x, z, w, dweight_accumulator=acc)
    _, saved = rmsnorm_silu_gate_det_fwd(x, z, w)
    with pytest.raises(ValueError, match="dweight_accumulator"):
        rmsnorm_silu_gate_det_bwd(dy, saved, dweight_accumulator=acc)
    assert torch.equal(acc, torch.zeros_like(acc))


def test_expanded_upstream_gradient(make_inputs, reference_grads):
    """y.sum().backward() hands the backward a stride-0 dy."""
    x, z, w, _ = make_inputs((6, 40), torch.float32, seed=5)
    got = _run(x, z, w, torch.ones(1, device=DEV).expand(6, 40))
    _check(got, reference_grads(x, z, w, torch.ones(6, 40, device=DEV)), torch.float32)
