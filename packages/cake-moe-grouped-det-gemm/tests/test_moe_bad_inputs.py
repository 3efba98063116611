"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_moe_grouped_det_gemm.api as api
import pytest
import torch
from _moe_cases import DEV, make, offs_of
from cake_core.testing import assert_raises_unmodified, randn
from cake_moe_grouped_det_gemm import (
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_fwd", "_launch_bwd", "_grouped_mm", "_launch_wgrad"):
        monkeypatch.setattr(api, name, boom)


def _t(shape, dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


def _i32(vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEV)


def base():
    x, w, offs, _ = make([3, 0, 5], N=8, K=16)
    return {"x": x, "weight": w, "offs": offs}


def w_(a, **kw):
    return {**a, **kw}


CASES = {
    "x 1-D": (lambda a: w_(a, x=_t((16,))), "x: expected 2-D"),
    "x int": (lambda a: w_(a, x=a["x"].to(torch.int32)), "x: expected dtype"),
    "x float64": (lambda a: w_(a, x=a["x"].double(), weight=a["weight"].double()),
                  "x: expected dtype"),
    "K = 0": (lambda a: w_(a, x=_t((8, 0)), weight=_t((3, 8, 0))), "x: in_features"),
    "weight 2-D": (lambda a: w_(a, weight=_t((8, 16))), "weight: expected 3-D"),
    "weight wrong K": (lambda a: w_(a, weight=_t((3, 8, 15))),
                       r"weight: expected shape \[\*, \*, 16\]"),
    "weight [E, K, N]": (lambda a: w_(a, weight=_t((3, 16, 8))),
                         r"weight: expected shape \[\*, \*, 16\] \(\[E, N, K\]: E stacked "
                         r"torch.nn.Linear weights \[out_features, in_features\]; \[E, K, N\] "
                         r"\(torch._grouped_mm's mat_b\) is not served\), got \[3, 16, 8\]"),
    "weight dtype": (lambda a: w_(a, weight=a["weight"].half()), "weight: expected dtype"),
    "E = 0": (lambda a: w_(a, weight=_t((0, 8, 16)), offs=_i32([])), "weight: needs E"),
    "N = 0": (lambda a: w_(a, weight=_t((3, 0, 16))), "weight: needs E"),
    "no offs": (lambda a: w_(a, offs=None), "exactly one of offs and m_sizes"),
    "offs and m_sizes": (lambda a: w_(a, m_sizes=_i32([3, 0, 5])),
                         "exactly one of offs and m_sizes"),
    "offs int64": (lambda a: w_(a, offs=a["offs"].long()), "offs: expected dtype"),
    "offs float": (lambda a: w_(a, offs=a["offs"].float()), "offs: expected dtype"),
    "offs wrong length": (lambda a: w_(a, offs=_i32([3, 8])), r"offs: expected shape \[3\]"),
    "offs 2-D": (lambda a: w_(a, offs=_i32([[3, 3, 8]])), r"offs: expected shape \[3\]"),
    "offs not a tensor": (lambda a: w_(a, offs=[3, 3, 8]), "offs: expected a torch"),
    "offs decreasing": (lambda a: w_(a, offs=_i32([3, 2, 8])), "offs: must be non-decreasing"),
    "offs past M": (lambda a: w_(a, offs=_i32([3, 3, 9])), r"offs: values must lie in \[0"),
    "offs negative": (lambda a: w_(a, offs=_i32([-1, 3, 8])), r"offs: values must lie"),
    "m_sizes negative": (lambda a: w_(a, offs=None, m_sizes=_i32([4, -1, 5])),
                         "m_sizes: values must be >= 0"),
    "m_sizes sum > M": (lambda a: w_(a, offs=None, m_sizes=_i32([4, 1, 5])),
                        "m_sizes: sum 10 exceeds"),
    "m_sizes int64": (lambda a: w_(a, offs=None, m_sizes=_i32([3, 0, 5]).long()),
                      "m_sizes: expected dtype"),
    "offs on meta": (lambda a: w_(a, offs=torch.ones(3, dtype=torch.int32, device="meta")),
                     "offs: on meta"),
    "weight on meta": (lambda a: w_(a, weight=torch.ones(3, 8, 16, device="meta")),
                       "weight: on meta"),
    "main_grad shape": (lambda a: w_(a, main_grad=_t((3, 16, 8))),
                        r"main_grad: expected shape \[3, 8, 16\]"),
    "main_grad dtype": (lambda a: w_(a, main_grad=_t((3, 8, 16)).half()),
                        "main_grad: expected dtype"),
    "main_grad strided": (lambda a: w_(a, main_grad=_t((3, 16, 8)).transpose(1, 2)),
                          "main_grad: must be contiguous"),
}


#: cases whose fault is in the values of offs / m_sizes: checked on the host only when the
#: tensor lives on the CPU (on a GPU reading them would cost a host sync: the kernels clamp
#: them instead, see test_offs_values_on_device_are_clamped_not_read)
VALUE_CASES = ("offs decreasing", "offs past M", "offs negative", "m_sizes negative",
               "m_sizes sum > M")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inputs_refused_before_launch(case, no_launch):
    if case in VALUE_CASES and torch.device(DEV).type != "cpu":
        pytest.skip("offs / m_sizes values on a GPU are not read by the host (no sync)")
    change, match = CASES[case]
    kwargs = change(base())
    assert_raises_unmodified(moe_grouped_det_gemm, kwargs, match)
    if "main_grad" not in kwargs:
        assert_raises_unmodified(moe_grouped_det_gemm_fwd, kwargs, match)


def test_bad_backward_grads():
    x, w, offs, dy = make([3, 0, 5], N=8, K=16)
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs)
    for dyb, match in ((dy[:, :7], r"dy: expected shape \[8, 8\]"),
                       (dy.half(), "dy: expected dtype"),
                       (dy[:7], r"dy: expected shape")):
        assert_raises_unmodified(moe_grouped_det_gemm_bwd, {"dy": dyb, "saved": saved}, match)
    assert_raises_unmodified(moe_grouped_det_gemm_bwd,
                             {"dy": dy, "saved": saved, "main_grad": _t((3, 8, 15))},
                             "main_grad: expected shape")


def test_offs_values_on_device_are_clamped_not_read():
    """What the docstring promises for offsets the host cannot check (here on the CPU, passed
    past the host check): the kernels clamp them, nothing is read or written out of bounds."""
    x, w, _, _ = make([3, 0, 5], N=8, K=16)
    ends = api._row_ends(_i32([3, 2, 99]), None, x.shape[0])
    assert ends.tolist() == [3, 3, 8]
    assert api._row_ends(None, _i32([4, -2, 9]), 8).tolist() == [4, 4, 8]
    assert offs_of([1, 2]).tolist() == [1, 3]
