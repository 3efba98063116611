"""Mode refusals both ways with the real objects of both packages, the deterministic-
algorithms alert, flash-attn's ``deterministic=True``, and the name rules."""

import dataclasses
import warnings

import cake_gqa_det_train as det
import cake_gqa_train as nd
import pytest
import torch
from _gqa_nd_cases import DEV, make
from cake_core import Mode


@pytest.fixture
def case():
    return make([20, 45], seed=7)


def test_det_entries_refuse_nondet_objects(case):
    q, k, v, do, cq, ck = case
    with pytest.raises(ValueError, match="plan"):
        det.gqa_det(q, k, v, cq, ck, plan=nd.make_plan(64, q.dtype, DEV))
    ws = nd.GQAWorkspace.for_plan(nd.make_plan(64, q.dtype, DEV), DEV, 4, 65, 2, 65)
    with pytest.raises(ValueError, match="workspace"):
        det.gqa_det(q, k, v, cq, ck, workspace=ws)
    _, _, saved = nd.gqa_fwd(q, k, v, cq, ck)
    with pytest.raises(ValueError, match="saved.*mode=det"):
        det.gqa_det_bwd(do, saved)


def test_nondet_entries_refuse_det_objects(case):
    q, k, v, do, cq, ck = case
    with pytest.raises(ValueError, match="plan"):
        nd.gqa(q, k, v, cq, ck, plan=det.make_plan(64, q.dtype, DEV))
    ws = det.GQADetWorkspace.for_plan(det.make_plan(64, q.dtype, DEV), DEV, 4, 65)
    with pytest.raises(ValueError, match="workspace"):
        nd.gqa(q, k, v, cq, ck, workspace=ws)
    _, _, saved = det.gqa_det_fwd(q, k, v, cq, ck)
    with pytest.raises(ValueError, match="saved.*mode=nondet"):
        nd.gqa_bwd(do, saved)


def test_plan_mode_is_nondet_and_serialises():
    p = nd.make_plan(128, torch.bfloat16, DEV)
    assert p.mode == Mode.NONDET and nd.GQAPlan().mode == Mode.NONDET
    assert nd.GQAPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(p, mode=Mode.DET)
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="bwd_atomic"):
            dataclasses.replace(p, bwd_atomic=bad)


def test_low_level_matches_autograd_and_workspace(case):
    q, k, v, do, cq, ck = case
    out, _, saved = nd.gqa_fwd(q, k, v, cq, ck)
    dq, dk, dv = nd.gqa_bwd(do, saved)
    plan = nd.make_plan(64, q.dtype, DEV)
    ws = nd.GQAWorkspace.for_plan(plan, DEV, 4, q.shape[0], 2, k.shape[0])
    dq2, dk2, dv2 = nd.gqa_bwd(do, saved, workspace=ws)
    for a, b in ((dq, dq2), (dk, dk2), (dv, dv2)):
        torch.testing.assert_close(a, b)
    qq = q.detach().clone().requires_grad_()
    o = nd.gqa(qq, k, v, cq, ck)
    o.backward(do)
    assert torch.equal(o.detach(), out)
    torch.testing.assert_close(qq.grad, dq)


def test_deterministic_algorithms_alert(case):
    q, k, v, do, cq, ck = case
    qq = q.detach().clone().requires_grad_()
    was = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        o = nd.gqa(qq, k, v, cq, ck)  # the forward is not refused
        with pytest.raises(RuntimeError, match="cake_gqa_det_train"):
            o.backward(do)
        _, _, saved = nd.gqa_fwd(q, k, v, cq, ck)
        with pytest.raises(RuntimeError, match="cake_gqa_det_train"):
            nd.gqa_bwd(do, saved)
        torch.use_deterministic_algorithms(True, warn_only=True)
        import cake_core.mode
        cake_core.mode._ALERTED.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            nd.gqa(qq, k, v, cq, ck).backward(do)
            nd.gqa(qq, k, v, cq, ck).backward(do)
        assert sum("cake_gqa_det_train" in str(x.message) for x in w) == 1
        assert qq.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)


def test_flash_attn_deterministic_true_names_det_package(case):
    q, k, v, _, cq, ck = case
    with pytest.raises(ValueError, match="cake_gqa_det_train"):
        nd.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45, deterministic=True)
    qb = q[:40].reshape(2, 20, 4, 64)
    kb = k[:40].reshape(2, 20, 2, 64)
    with pytest.raises(ValueError, match="cake_gqa_det_train"):
        nd.flash_attn_func(qb, kb, kb, deterministic=True)
    assert torch.equal(nd.flash_attn_func(qb, kb, kb, causal=True), nd.gqa(qb, kb, kb))


@pytest.mark.parametrize("kw,match", [(dict(dropout_p=0.1), "dropout_p"),
                                      (dict(alibi_slopes=torch.ones(4)), "alibi"),
                                      (dict(return_attn_probs=True), "return_attn_probs")])
def test_flash_attn_refusals(case, kw, match):
    q, k, v, _, cq, ck = case
    with pytest.raises(ValueError, match=match):
        nd.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45, **kw)


def test_bad_inputs_as_det(case):
    q, k, v, _, cq, ck = case
    with pytest.raises(ValueError, match="multiple"):
        nd.gqa(q, k[:, :1].expand(-1, 3, -1), v[:, :1].expand(-1, 3, -1), cq, ck)
    with pytest.raises(ValueError, match="head dim"):
        nd.gqa(q[..., :32], k[..., :32], v[..., :32], cq, ck)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        nd.gqa(q, k, v, torch.tensor([0, 30, 20], dtype=torch.int32, device=DEV), ck)


def test_names_carry_no_det():
    """The exception package's public names carry no ``det``; the det package's no
    ``nondet``."""
    for name in nd.__all__:
        assert "det" not in name.lower(), name
    for name in det.__all__:
        assert "nondet" not in name.lower(), name


def test_workspace_gradients_in_fresh_memory(case):
    """With a workspace, dK / dV (fp32 sums there) come back in their own memory: autograd
    accepts them and a second backward does not overwrite the first's."""
    q, k, v, do, cq, ck = case
    plan = nd.make_plan(64, q.dtype, DEV)
    ws = nd.GQAWorkspace.for_plan(plan, DEV, 4, q.shape[0], 2, k.shape[0])
    kk = k.detach().clone().requires_grad_()
    nd.gqa(q, kk, v, cq, ck, plan=plan, workspace=ws).backward(do)
    _, _, saved = nd.gqa_fwd(q, k, v, cq, ck, plan=plan)
    _, dk1, dv1 = nd.gqa_bwd(do, saved, workspace=ws)
    keep = dv1.clone()
    nd.gqa_bwd(do * 2, saved, workspace=ws)
    assert torch.equal(dv1, keep)
    torch.testing.assert_close(kk.grad, dk1)


def test_defaults_are_the_cuda_rule_at_head_dim_128(monkeypatch):
    """The defaults are Hopper's rule (the det rule reads the device's shared memory:
    pinned to Hopper's, so the test holds on any GPU)."""
    import cake_gqa_det_train.plan as gp
    from cake_gqa_train.plan import _rule

    monkeypatch.setattr(gp, "shared_memory", lambda device: gp.HOPPER_SMEM)
    assert nd.GQAPlan() == _rule(128, torch.bfloat16, torch.device("cuda"))


def test_flash_attn_deterministic_flags(case):
    """``deterministic`` as flash-attn takes it: falsy values run, truthy ones are refused
    (naming the det package) in this package and accepted by the det one."""
    import numpy as np

    q, k, v, _, cq, ck = case
    want = nd.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45)
    for flag in (0, np.bool_(False)):
        assert torch.equal(nd.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45,
                                                     deterministic=flag), want)
    for flag in (1, np.bool_(True)):
        with pytest.raises(ValueError, match="cake_gqa_det_train"):
            nd.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45, deterministic=flag)
        det.flash_attn_varlen_func(q, k, v, cq, ck, 45, 45, deterministic=flag)
