"""A sample of the det package's bad inputs: ValueError before any launch, the caller's
tensors unmodified."""

import cake_dense_projection_nondet_gemm.api as api
import pytest
import torch
from cake_core.testing import assert_raises_unmodified, no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_nondet_gemm import (
    LinearNondet,
    dense_projection_nondet,
    dense_projection_nondet_bwd,
    dense_projection_nondet_fwd,
    make_nondet_plan,
)

DEV = default_device()


def _t(shape, dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


def _base():
    return {"x": _t((4, 16)), "weight": _t((8, 16))}


CASES = {
    "x int": (lambda a: {**a, "x": a["x"].to(torch.int32)}, "x: expected dtype"),
    "weight transposed": (lambda a: {**a, "weight": _t((16, 8))},
                          r"weight: expected shape \[\*, 16\]"),
    "bias shape": (lambda a: {**a, "bias": _t((7,))}, r"bias: expected shape \[8\]"),
    "main_grad dtype": (lambda a: {**a, "main_grad": _t((8, 16), torch.bfloat16)},
                        "main_grad: expected dtype"),
    "plan of another N": (lambda a: {**a, "plan": make_nondet_plan(4, 9, 16, torch.float32,
                                                                    DEV)},
                          "plan: made for out_features=9"),
    "plan as a dict": (lambda a: {**a, "plan": make_nondet_plan(4, 8, 16, torch.float32, DEV)
                                  .to_dict()}, "plan: got dict"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refusals_before_launch(name):
    change, match = CASES[name]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        assert_raises_unmodified(dense_projection_nondet, change(_base()), match)


def test_backward_refusals_before_launch():
    y, saved = dense_projection_nondet_fwd(_t((4, 16)), _t((8, 16)))
    with no_kernel_launches(api, "_launch_bwd"):
        assert_raises_unmodified(dense_projection_nondet_bwd,
                                 {"dy": _t((4, 9)), "saved": saved}, r"dy: expected shape")
        assert_raises_unmodified(dense_projection_nondet_bwd,
                                 {"dy": y.half(), "saved": saved}, "dy: expected dtype")


def test_module_refuses_wrong_in_features():
    with pytest.raises(ValueError, match="x: last dim must be in_features=16"):
        LinearNondet(16, 8, device=DEV)(_t((4, 15)))
