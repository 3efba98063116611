"""FLA's disable_recompute on the nondet entry: this package's rule plan with
keep_states = 1 (a nondet plan, made once in this package's cache), the default call's bits
with no recompute in the backward, a nondet plan given that recomputes refused before any
launch, off by truthiness."""

import dataclasses

import cake_gdn_det_train.api as det_api
import numpy as np
import pytest
import torch
from _gdn_nd_cases import DEV, make_inputs
from cake_core import Mode
from cake_core.testing import (
    assert_bitwise_equal_named,
    assert_raises_unmodified,
    leaf_grads,
    no_kernel_launches,
)
from cake_gdn_nondet_train import (
    GDNNondetPlan,
    chunk_gated_delta_rule_nondet,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
)
from cake_gdn_nondet_train.api import NONDET

# packed: an empty document, then lengths 1, 39 and 30
CU = (0, 0, 1, 40, 70)
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state")


def _run(leaves, cu, monkeypatch, **kw):
    """``(outputs and leaf gradients, forward-recurrence runs)`` of one step."""
    calls = []
    real = det_api._prep_and_state
    monkeypatch.setattr(det_api, "_prep_and_state",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    def f(q, k, v, g, beta, h0):
        o, ht = chunk_gated_delta_rule_nondet(q, k, v, g, beta, None, h0, True,
                                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                              **kw)
        loss = (o.float() * o.detach().float().cos()).sum()
        return loss + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    got = leaf_grads(f, leaves)
    monkeypatch.setattr(det_api, "_prep_and_state", real)
    return got, len(calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disable_recompute_is_the_rules_plan_kept(dtype, monkeypatch):
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)
    leaves = make_inputs(1, 70, 1, 2, 16, 16, dtype, seed=11, n_states=len(CU) - 1, h0=True)
    rule = det_api._resolve_plan(None, 16, 16, dtype, DEV, state_programs=8, types=NONDET)
    kept = det_api._resolve_plan(None, 16, 16, dtype, DEV, state_programs=8, types=NONDET,
                                 disable_recompute=True)
    assert type(kept) is GDNNondetPlan and kept.mode is Mode.NONDET
    assert kept == dataclasses.replace(rule, keep_states=1) and rule.keep_states == 0
    assert det_api._resolve_plan(None, 16, 16, dtype, DEV, state_programs=8, types=NONDET,
                                 disable_recompute=True) is kept
    want, n = _run(leaves, cu, monkeypatch)
    assert n == 2  # the forward's recurrence and the backward's recompute
    for kw in (dict(disable_recompute=True), dict(plan=kept, disable_recompute=True)):
        got, n = _run(leaves, cu, monkeypatch, **kw)
        assert n == 1, kw
        assert_bitwise_equal_named(got, want, NAMES, f"{kw} differs from the default")
    for flag in (False, None, 0, np.False_):
        got, n = _run(leaves, cu, monkeypatch, disable_recompute=flag)
        assert n == 2, flag
        assert_bitwise_equal_named(got, want, NAMES, f"disable_recompute={flag!r} differs")


def test_disable_recompute_with_a_recomputing_plan_refused():
    q, k, v, g, beta, _ = make_inputs(1, 70, 1, 2, 16, 16, seed=13)
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    base = dict(q=q, k=k, v=v, g=g, beta=beta)
    msg = (r"disable_recompute=True: the plan given has keep_states=0 .*pass a plan with "
           r"keep_states=1 \(dataclasses.replace\(plan, keep_states=1\)\) or drop "
           r"disable_recompute")
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd", "_l2norm"):
        kw = dict(base, plan=plan, disable_recompute=True)
        err = assert_raises_unmodified(chunk_gated_delta_rule_nondet, kw, msg)
        s = is_supported_nondet(**kw)
        assert not s and s.reason == str(err)
        with pytest.raises(ValueError, match=msg):
            saved_bytes_nondet(**kw)
        more = saved_bytes_nondet(**base, disable_recompute=True)
        assert more == saved_bytes_nondet(**base, plan=dataclasses.replace(plan, keep_states=1))
        assert more > saved_bytes_nondet(**base) == saved_bytes_nondet(**base,
                                                                        disable_recompute=0)
