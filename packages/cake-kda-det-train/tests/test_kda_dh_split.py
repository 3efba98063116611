"""``plan.dh_split = 1``: the backward's dS recurrence keeps the state gradient as two
halves of the key channels (``kda_bwd_dh_split_kernel``). Every output and gradient
against the float64 reference (packed documents with an empty and a 1-token one, HV = 2H,
an initial state and dht, K filling one half partly, K = 24 in halves of 16, K = 16 with
the second half empty), close to ``dh_split = 0`` and bitwise repeatable; the field
serialised, ``block_k < 32`` refused, ``rec_form`` != 0 leaving it unused (same bits)."""

import dataclasses

import pytest
import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan

DEV = default_device()
LENS = [1, 37, 0, 90]


def _plan(K, V, dtype, **over):
    # rec_form = 0 unless named: dh_split is a form of rec_form 0's dS kernel
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **{"dh_split": 1, "rec_form": 0,
                                                              **over})


@pytest.mark.parametrize("K, V, dtype, over", [
    (24, 16, torch.float32, dict(block_k_inner=16)),
    (40, 24, torch.float32, dict(block_k_inner=16, keep_a=0, keep_aqk=0)),
    (32, 32, torch.bfloat16, dict(block_k_inner=16)),
    (16, 16, torch.float32, dict(block_k=32, block_k_inner=16)),
], ids=["fp32-k24", "fp32-k40-recompute", "bf16-k32", "fp32-k16-empty-half"])
def test_dh_split_vs_reference(K, V, dtype, over, kda):
    """K = 24 in halves of 16 (the second partly masked); K = 40 in halves of 32 (the
    second holds 8 channels); K = 16 in halves of 16 (the second all masked); bf16 at
    K = V = 32 stores 16-bit intermediates; documents of 1, 37, 0 and 90 tokens (a
    sequence of two chunks, so dS crosses a chunk)."""
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=71, g_mode="real")


def test_dh_split_close_to_whole_and_repeats(kda):
    """Against ``dh_split = 0`` (the same recurrence, du summed in two dots; on CUDA with
    ``fp32_dots = 1``, the one allowed there): close; the same bits twice."""
    K, V = 40, 24
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, seed=73,
                                               n_states=len(LENS), h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, torch.float32, DEV, seed=74)
    dht = randn(h0.shape, torch.float32, DEV, seed=75)
    new = _plan(K, V, torch.float32, block_k_inner=16 if DEV.type == "cpu" else 32)
    # on CUDA, rec_form 0's whole dS kernel with fp32_dots = 2 at K in (32, 64] is refused
    # (cuda_plan_problem): the baseline there takes fp32_dots = 1
    base = dataclasses.replace(new, dh_split=0, **({} if DEV.type == "cpu" else {"fp32_dots": 1}))
    kda.assert_repeats_and_close((q, k, v, g, beta), h0, cu, do, dht, new, base)


def test_dh_split_unused_with_rec_form(kda):
    """With ``rec_form`` != 0 the dS kernel is the operand-form one whatever ``dh_split``
    says: the same bits as ``dh_split = 0``."""
    K, V = 40, 24
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, seed=77,
                                               n_states=len(LENS), h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, torch.float32, DEV, seed=78)
    plan = _plan(K, V, torch.float32, rec_form=1,
                 block_k_inner=16 if DEV.type == "cpu" else 32)
    got = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, None, plan)
    want = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, None,
                             dataclasses.replace(plan, dh_split=0))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert torch.equal(a, b), i


def test_dh_split_field_serialised_and_checked():
    plan = make_plan(128, 128, torch.bfloat16, DEV)
    assert plan.dh_split == 0  # the rule keeps the whole tile
    on = dataclasses.replace(plan, dh_split=1)
    d = on.to_dict()
    assert d["dh_split"] == 1 and d["version"] == KDADetPlan.format_version == 1
    assert KDADetPlan.from_dict(d) == on and on.key != plan.key
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="dh_split"):
            dataclasses.replace(plan, dh_split=bad)
    small = make_plan(16, 16, torch.float32, DEV)
    with pytest.raises(ValueError, match="dh_split=1 needs block_k >= 32"):
        dataclasses.replace(small, dh_split=1)
