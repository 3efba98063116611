"""``plan.inv_blocked = 1``: the forward's chunk prep inverts ``I + A`` with the four 16 x 16
diagonal blocks apart first (``cake_core.triangular.unit_lower_inverse_blocked``). o, final
state and every gradient against the float64 reference (packed documents with an empty and
a 1-token one, strong decays, kept and recomputed T, K off the block size); close to
``inv_blocked = 0``; bitwise repeatable; the prep kernel takes the blocked form only with
the field on; the field serialised (format version 7), a format-6 dict refused."""

import dataclasses

import pytest
import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan

DEV = default_device()
LENS = [1, 70, 0, 65]


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), inv_blocked=1, **over)


@pytest.mark.parametrize("K, V, H, HV, dtype, over", [
    (24, 16, 1, 2, torch.float32, dict(block_k_inner=16)),
    (24, 16, 1, 2, torch.float32, dict(block_k_inner=16, keep_a=0, keep_aqk=0)),
    (32, 32, 1, 2, torch.bfloat16, dict(block_k_inner=16)),
], ids=["fp32-kept", "fp32-recompute", "bf16"])
def test_inv_blocked_vs_reference(K, V, H, HV, dtype, over, kda):
    """Documents of 1, 70, 0 and 65 tokens (a chunk cut short after 6 and after 1 token,
    an empty document, a 1-token one); K = 24 ends inside a 32-wide channel tile."""
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=101, H=H, HV=HV)


def test_inv_blocked_close_to_whole_tile_and_repeats(kda):
    """Against ``inv_blocked = 0`` (the same inverse, summed in another order): close; and
    the same bits twice."""
    K, V = 24, 16
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, seed=103,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, torch.float32, DEV, seed=104)
    dht = randn(h0.shape, torch.float32, DEV, seed=105)
    new = _plan(K, V, torch.float32, block_k_inner=16 if DEV.type == "cpu" else 32)
    base = dataclasses.replace(new, inv_blocked=0)
    kda.assert_repeats_and_close((q, k, v, g, beta), h0, cu, do, dht, new, base)


def test_inv_blocked_reaches_the_prep_kernel(kda, monkeypatch):
    """The prep kernel is launched with INV_BLOCKED equal to the plan's field."""
    calls = kda.spy_launches(monkeypatch, "kda_fwd_prep_kernel")
    K, V = 16, 16
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 21, 1, 1, K, V, seed=107, n_states=1, h0=True)
    cu = kda.cu_of([21])
    do = randn(v.shape, torch.float32, DEV, seed=108)
    for flag in (0, 1):
        calls.clear()
        kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, None,
                          dataclasses.replace(make_plan(K, V, torch.float32, DEV),
                                              inv_blocked=flag))
        seen = [kwargs["INV_BLOCKED"] for _, kwargs in calls]
        assert seen and set(seen) == {bool(flag)}, (flag, seen)


def test_inv_blocked_field_serialised_and_checked():
    plan = make_plan(128, 128, torch.bfloat16, DEV)
    assert plan.inv_blocked == 1  # the rule's (session 18)
    d = plan.to_dict()
    assert d["inv_blocked"] == 1 and d["version"] == KDADetPlan.format_version == 1
    assert KDADetPlan.from_dict(d) == plan
    assert dataclasses.replace(plan, inv_blocked=0).key != plan.key
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="inv_blocked"):
            dataclasses.replace(plan, inv_blocked=bad)
