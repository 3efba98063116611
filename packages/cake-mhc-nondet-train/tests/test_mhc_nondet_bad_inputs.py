"""A sample of the det package's bad inputs: ValueError before any launch, the caller's
tensors unmodified."""

import cake_mhc_nondet_train.api as api
import pytest
import torch
from _mhc_nd_cases import DEV, make
from cake_core.testing import assert_raises_unmodified, no_kernel_launches
from cake_mhc_nondet_train import make_nondet_plan, mhc_nondet_finish, mhc_nondet_prepare

LAUNCHES = ("_launch_prepare_fwd", "_launch_prepare_bwd", "_launch_finish_fwd",
            "_launch_finish_bwd")


def _base():
    c = make(6, 4, 16)
    return {"X": c["X"], "phi": c["phi"], "alpha": c["alpha"], "bias": c["bias"]}


CASES = {
    "X 2-D": (lambda a: {**a, "X": a["X"][0]}, "X: expected a 3-D"),
    "X fp16": (lambda a: {**a, "X": a["X"].half()}, "X: expected dtype"),
    "3 streams": (lambda a: {**a, "X": a["X"][:, :3]}, "stream dimension"),
    "phi shape": (lambda a: {**a, "phi": a["phi"][:-1]}, "phi: expected shape"),
    "eps zero": (lambda a: {**a, "eps": 0.0}, "eps"),
    "sinkhorn_iters 0": (lambda a: {**a, "sinkhorn_iters": 0}, "sinkhorn_iters"),
    "plan of another C": (lambda a: {**a, "plan": make_nondet_plan(4, 32, torch.float32, DEV)},
                          "plan: made for n_streams=4, hidden_size=32"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_prepare_refusals_before_launch(name):
    change, match = CASES[name]
    with no_kernel_launches(api, *LAUNCHES):
        assert_raises_unmodified(mhc_nondet_prepare, change(_base()), match)


def test_finish_refusals_before_launch():
    a = _base()
    U, h = mhc_nondet_prepare(**a)
    with no_kernel_launches(api, *LAUNCHES):
        assert_raises_unmodified(mhc_nondet_finish, {"X": a["X"], "B": U[:, :8], "handle": h},
                                 "B: expected shape")
        assert_raises_unmodified(mhc_nondet_finish, {"X": a["X"][:3], "B": U, "handle": h},
                                 "X: expected shape")
