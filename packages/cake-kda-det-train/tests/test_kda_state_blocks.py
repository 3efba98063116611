"""``block_v_h`` (the V columns per program of the two state kernels), ``num_warps_dh``
and ``num_stages_dh`` (the backward dS kernel's), apart from ``block_v`` (the output
kernel's), ``num_warps_h`` and ``num_stages_h`` (the forward state kernel's). Session 20
(H200) measured each kernel apart (docs/benchmarks/kda.md). Against the float64 reference
with the state kernels and the output kernel in different V blocks (partial last blocks);
the fields serialised and checked; the CUDA rule's choices and shared-memory limits."""

import dataclasses

import pytest
import torch
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan
from cake_kda_det_train.plan import _rule, cuda_plan_problem

DEV = default_device()
LENS = [1, 65, 0, 9]


@pytest.mark.parametrize("K, V, dtype, over", [
    (24, 40, torch.float32, dict(block_v=64, block_v_h=16, num_warps_dh=2, num_stages_dh=2,
                                 store_16bit=0)),
    (24, 40, torch.float32, dict(block_v=16, block_v_h=32, num_stages_h=2,
                                 store_16bit=0)),
    (32, 48, torch.bfloat16, dict(block_v=32, block_v_h=64, num_warps_h=2)),
], ids=["fp32-vh16-o64", "fp32-vh32-o16", "bf16-vh64-o32"])
def test_state_and_output_blocks_vs_reference(K, V, dtype, over, kda):
    """V = 40 / 48 in state blocks of 16 / 32 / 64 and output blocks of 16 / 32 / 64: partly
    masked last blocks, different in the two kernels; documents of 1, 65, 0 and 9 tokens
    (the state kernels carry a document's state across a chunk boundary)."""
    plan = kda.variant_plan(
        lambda K, V, dtype, **o: dataclasses.replace(make_plan(K, V, dtype, DEV), **o),
        K, V, dtype, over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=201)


def test_format_9_fields_serialised_and_checked():
    rule = make_plan(64, 40, torch.bfloat16, DEV)
    plan = dataclasses.replace(rule, block_v_h=32, num_warps_dh=2, num_stages_dh=3)
    d = plan.to_dict()
    assert d["version"] == KDADetPlan.format_version == 1
    assert (d["block_v_h"], d["num_warps_dh"], d["num_stages_dh"]) == (32, 2, 3)
    assert KDADetPlan.from_dict(d) == plan and plan.key != rule.key
    for name, bad in (("block_v_h", 24), ("block_v_h", 8), ("block_v_h", 128),
                      ("num_warps_dh", 3), ("num_stages_dh", 0), ("num_stages_dh", 5)):
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(rule, **{name: bad})
    with pytest.raises(ValueError, match="store_16bit=1 needs.*block_v_h >= 32"):
        dataclasses.replace(rule, store_16bit=1, block_v_h=16)


def test_cuda_rule_state_kernel_fields():
    """The CUDA rule at K = V = 128 (session 20, H200): the output kernel in 128 columns
    with 16-bit intermediates, the state kernels in 64; the forward state kernel 4 warps and
    3 stages, the dS kernel 8 warps and 2."""
    cuda = torch.device("cuda")
    for dt in (torch.bfloat16, torch.float16):
        p = _rule(128, 128, dt, cuda)
        assert (p.block_v, p.block_v_h, p.num_warps_h, p.num_stages_h, p.num_warps_dh,
                p.num_stages_dh) == (128, 64, 4, 3, 8, 2), dt
    p = _rule(128, 128, torch.float32, cuda)
    assert (p.block_v, p.block_v_h, p.num_warps_h, p.num_stages_h, p.num_warps_dh,
            p.num_stages_dh) == (64, 64, 8, 1, 8, 1)


def test_cuda_refuses_dh_stages_that_overflow_shared_memory():
    """num_stages_dh (format 9) inherits num_stages_h's shared-memory limits on CUDA: fp32
    intermediates at K > 64 need 1 stage; K = 128 with 64-column state
    blocks at most 2 (3 asked 256 KiB on an H200, session 20); the rule picks neither."""
    cuda = torch.device("cuda")
    f32 = _rule(128, 128, torch.float32, cuda)
    assert "num_stages_dh=1" in cuda_plan_problem(
        dataclasses.replace(f32, num_stages_dh=2), torch.float32)
    bf = _rule(128, 128, torch.bfloat16, cuda)
    assert cuda_plan_problem(bf, torch.bfloat16) is None
    assert "num_stages_dh=1" in cuda_plan_problem(bf, torch.float32)  # bf16's plan, fp32 in
    assert "num_stages_dh <= 2" in cuda_plan_problem(
        dataclasses.replace(bf, num_stages_dh=3), torch.bfloat16)
    for over in (dict(num_stages_dh=3, block_v_h=32),):
        assert cuda_plan_problem(dataclasses.replace(bf, **over), torch.bfloat16) is None, over
