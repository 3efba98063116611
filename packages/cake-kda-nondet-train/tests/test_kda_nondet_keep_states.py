"""FLA's disable_recompute on the nondet entry: this package's rule plan with
keep_states = 1 (a nondet plan, made once in this package's cache), the default call's bits
with no recompute in the backward, a nondet plan given that recomputes refused before any
launch, off by truthiness."""

import dataclasses

import cake_kda_det_train.api as det_api
import cake_kda_det_train.chunk as det_chunk
import numpy as np
import pytest
import torch
from _kda_nd_cases import DEV, NAMES, cu_of, make
from cake_core import Mode
from cake_core.testing import (
    assert_bitwise_equal_named,
    assert_raises_unmodified,
    leaf_grads,
    no_kernel_launches,
)
from cake_kda_nondet_train import (
    KDANondetPlan,
    chunk_kda_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
)
from cake_kda_nondet_train.api import NONDET_KINDS


def _run(leaves, cu, monkeypatch, **kw):
    """``(outputs and leaf gradients, forward state passes)`` of one step (Kimi Linear's
    call: the L2 norm, the in-kernel gate and beta's sigmoid)."""
    calls = []
    real = det_chunk._prep_and_state
    monkeypatch.setattr(det_chunk, "_prep_and_state",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    def f(q, k, v, g, beta, h0, A_log, dt_bias):
        o, ht = chunk_kda_nondet(q, k, v, g, beta, None, h0, True,
                                 use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                 use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                                 use_beta_sigmoid_in_kernel=True, **kw)
        loss = (o.float() * o.detach().float().cos()).sum()
        return loss + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    got = leaf_grads(f, leaves)
    monkeypatch.setattr(det_chunk, "_prep_and_state", real)
    return got, len(calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disable_recompute_is_the_rules_plan_kept(dtype, monkeypatch):
    cu = cu_of([0, 1, 39, 30])
    leaves = list(make(1, 70, 1, 2, 16, 16, seed=11, raw=True, n_states=4))
    leaves[:3] = [t.to(dtype) for t in leaves[:3]]
    rule = det_api._resolve_plan(None, 16, 16, dtype, DEV, NONDET_KINDS)
    kept = det_api._resolve_plan(None, 16, 16, dtype, DEV, NONDET_KINDS, True)
    assert type(kept) is KDANondetPlan and kept.mode is Mode.NONDET
    assert kept == dataclasses.replace(rule, keep_states=1) and rule.keep_states == 0
    assert det_api._resolve_plan(None, 16, 16, dtype, DEV, NONDET_KINDS, True) is kept
    want, n = _run(leaves, cu, monkeypatch)
    assert n == 2  # the forward's state pass and the backward's recompute
    for kw in (dict(disable_recompute=True), dict(plan=kept, disable_recompute=True)):
        got, n = _run(leaves, cu, monkeypatch, **kw)
        assert n == 1, kw
        assert_bitwise_equal_named(got, want, NAMES, f"{kw} differs from the default")
    for flag in (False, None, 0, np.False_):
        got, n = _run(leaves, cu, monkeypatch, disable_recompute=flag)
        assert n == 2, flag
        assert_bitwise_equal_named(got, want, NAMES, f"disable_recompute={flag!r} differs")


def test_disable_recompute_with_a_recomputing_plan_refused():
    q, k, v, g, beta, *_ = make(1, 70, 1, 2, 16, 16, seed=13, h0=False)
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    base = dict(q=q, k=k, v=v, g=g, beta=beta)
    msg = (r"disable_recompute=True: the plan given has keep_states=0 .*pass a plan with "
           r"keep_states=1 \(dataclasses.replace\(plan, keep_states=1\)\) or drop "
           r"disable_recompute")
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd", "_l2norm"):
        kw = dict(base, plan=plan, disable_recompute=True)
        err = assert_raises_unmodified(chunk_kda_nondet, kw, msg)
        s = is_supported_nondet(**kw)
        assert not s and s.reason == str(err)
        with pytest.raises(ValueError, match=msg):
            saved_bytes_nondet(**kw)
        more = saved_bytes_nondet(**base, disable_recompute=True)
        assert more == saved_bytes_nondet(**base, plan=dataclasses.replace(plan, keep_states=1))
        assert more > saved_bytes_nondet(**base) == saved_bytes_nondet(**base,
                                                                        disable_recompute=0)
