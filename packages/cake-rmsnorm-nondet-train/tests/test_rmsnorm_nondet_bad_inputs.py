"""Bad inputs raise ValueError before any launch (the det package's checks, run by this
package's entries) and leave the caller's tensors as they were."""

import cake_rmsnorm_det_train.api as det_api
import pytest
import torch
from _rmsnorm_nd_cases import DEV
from cake_core.testing import assert_raises_unmodified, randn
from cake_rmsnorm_nondet_train import (
    RMSNormNondet,
    make_nondet_plan,
    rmsnorm_nondet,
    rmsnorm_nondet_bwd,
    rmsnorm_nondet_fwd,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(det_api, "_launch_fwd", boom)
    monkeypatch.setattr(det_api, "_launch_bwd", boom)


def _x(shape=(4, 16), dtype=torch.float32):
    return randn(shape, dtype, DEV, seed=5)


CASES = {
    "x int": ({"x": _x().to(torch.int32), "weight": _x((16,))}, "x: expected dtype"),
    "weight wrong shape": ({"x": _x(), "weight": _x((15,))}, r"weight: expected shape \[16\]"),
    "last dim not contiguous": ({"x": _x((16, 16)).t(), "weight": _x((16,))},
                                "x: last dimension must be contiguous"),
    "eps nan": ({"x": _x(), "weight": _x((16,)), "eps": float("nan")}, "eps"),
    "offset beyond fp32": ({"x": _x(), "weight": _x((16,)), "offset": -1e39}, "offset: .*fp32"),
    "residual dtype": ({"x": _x(), "weight": _x((16,)), "residual": _x(dtype=torch.float16)},
                       "residual: expected dtype"),
    "accumulator dtype": ({"x": _x(), "weight": _x((16,)),
                           "dweight_accumulator": _x((16,), torch.bfloat16)},
                          "dweight_accumulator: expected dtype"),
    "plan of another H": ({"x": _x(), "weight": _x((16,)),
                           "plan": make_nondet_plan(32, torch.float32, DEV)},
                          "plan: made for hidden_size=32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    kwargs, msg = CASES[case]
    assert_raises_unmodified(rmsnorm_nondet, kwargs, msg)


def test_low_level_bad_inputs(no_launch):
    x = _x()
    w = _x((16,))
    with pytest.raises(ValueError, match="eps"):
        rmsnorm_nondet_fwd(x, w, -1.0)
    with pytest.raises(ValueError, match="saved: got"):
        rmsnorm_nondet_bwd(torch.ones_like(x), None, {"xh": x})


def test_low_level_backward_checks(monkeypatch):
    x, w = _x(), _x((16,))
    _, saved = rmsnorm_nondet_fwd(x, w)
    monkeypatch.setattr(det_api, "_launch_bwd", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match="dy: expected shape"):
        rmsnorm_nondet_bwd(_x((4, 8)), None, saved)
    with pytest.raises(ValueError, match="dh: given, but the forward had no residual"):
        rmsnorm_nondet_bwd(torch.ones_like(x), torch.ones_like(x), saved)


def test_module_refuses_wrong_trailing_dims():
    with pytest.raises(ValueError, match="trailing dims"):
        RMSNormNondet(16)(_x((4, 8)))


def test_make_nondet_plan_refuses_bad_hidden_size():
    for bad in (0, 65537, True, 3.0):
        with pytest.raises(ValueError, match="hidden_size"):
            make_nondet_plan(bad, torch.float32, DEV)
