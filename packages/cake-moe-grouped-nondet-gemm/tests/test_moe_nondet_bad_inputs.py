"""A sample of the det package's bad inputs: ValueError before any launch, the caller's
tensors unmodified."""

import cake_moe_grouped_nondet_gemm.api as api
import pytest
import torch
from _moe_nd_cases import DEV, make, offs_of
from cake_core.testing import assert_raises_unmodified, no_kernel_launches
from cake_moe_grouped_det_gemm import make_moe_plans
from cake_moe_grouped_nondet_gemm import (
    make_nondet_plan,
    moe_experts_nondet,
    moe_feed_forward_nondet,
    moe_grouped_nondet_gemm,
    moe_grouped_nondet_gemm_bwd,
    moe_grouped_nondet_gemm_fwd,
)


def _base():
    x, w, offs, _ = make([4, 0, 6], dtype=torch.float32)
    return {"x": x, "weight": w, "offs": offs}


CASES = {
    "weight as [E, K, N]": (lambda a: {**a, "weight": a["weight"].transpose(1, 2).contiguous()},
                            r"weight: expected shape \[\*, \*, 24\]"),
    "offs int64": (lambda a: {**a, "offs": a["offs"].long()}, "offs: expected dtype"),
    "offs and m_sizes": (lambda a: {**a, "m_sizes": a["offs"]}, "exactly one of"),
    "decreasing offs": (lambda a: {**a, "offs": offs_of([6, -2, 6])}, "non-decreasing"),
    "offs past M": (lambda a: {**a, "offs": offs_of([4, 0, 7])}, r"\[0, M=10\]"),
    "plan of another E": (lambda a: {**a, "plan": make_nondet_plan(10, 2, 20, 24,
                                                                    torch.float32, DEV)},
                          "plan: made for num_experts=2"),
}


# offsets on a GPU are read by the kernels only (no host sync): refused on the CPU alone
VALUE_CASES = ("decreasing offs", "offs past M")


@pytest.mark.parametrize("name", list(CASES))
def test_refusals_before_launch(name):
    if name in VALUE_CASES and DEV.type != "cpu":
        pytest.skip("offs values on a GPU are not read by the host (no sync)")
    change, match = CASES[name]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        assert_raises_unmodified(moe_grouped_nondet_gemm, change(_base()), match)


def test_backward_refusals_before_launch():
    a = _base()
    y, saved = moe_grouped_nondet_gemm_fwd(a["x"], a["weight"], a["offs"])
    with no_kernel_launches(api, "_launch_bwd"):
        assert_raises_unmodified(moe_grouped_nondet_gemm_bwd,
                                 {"dy": y[:, :5].contiguous(), "saved": saved},
                                 r"dy: expected shape")


def test_layer_refusals_before_launch():
    x = torch.ones(6, 16, device=DEV)
    rw, wgu, wd = (torch.ones(4, 16, device=DEV), torch.ones(4, 24, 16, device=DEV),
                   torch.ones(4, 16, 12, device=DEV))
    with no_kernel_launches(api, "_launch_fwd"):
        assert_raises_unmodified(moe_feed_forward_nondet, dict(
            x=x, router_weight=rw, w_gate_up=wgu, w_down=wd, top_k=5), "top_k")
        assert_raises_unmodified(moe_experts_nondet, dict(
            x=x, router_logits=torch.ones(6, 4, device=DEV), w_gate_up=wgu, w_down=wd,
            top_k=5), "top_k")
        assert_raises_unmodified(moe_experts_nondet, dict(
            x=x, router_logits=torch.ones(6, 4, device=DEV), w_gate_up=wgu, w_down=wd,
            top_k=2, plans=make_moe_plans(6, 16, 12, 4, 2, torch.float32, DEV)),
            "MoEFeedForwardNondetPlans")
        assert_raises_unmodified(moe_feed_forward_nondet, dict(
            x=x, router_weight=rw, w_gate_up=wgu[:, :20], w_down=wd, top_k=2), "w_gate_up")
