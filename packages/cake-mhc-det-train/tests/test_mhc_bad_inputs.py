"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_mhc_det_train.api as api
import pytest
import torch
from _mhc_cases import DEV, make
from cake_core.testing import bitwise_equal
from cake_mhc_det_train import mhc_det_finish, mhc_det_prepare


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_prepare_fwd", "_launch_prepare_bwd", "_launch_finish_fwd",
                 "_launch_finish_bwd"):
        monkeypatch.setattr(api, name, boom)


def _base():
    c = make(6, 4, 16, torch.float32)
    return {"X": c["X"], "phi": c["phi"], "alpha": c["alpha"], "bias": c["bias"]}


def _with(**kw):
    def f():
        d = _base()
        for k, v in kw.items():
            d[k] = v(d) if callable(v) else v
        return d
    return f


PREPARE = {
    "X 2-D": (_with(X=lambda d: d["X"][0]), "X: expected a 3-D"),
    "X 5-D": (_with(X=lambda d: d["X"][None, None]), "X: expected a 3-D"),
    "X int": (_with(X=lambda d: d["X"].to(torch.int32)), "X: expected dtype"),
    "X fp64": (_with(X=lambda d: d["X"].double()), "X: expected dtype"),
    "X fp16": (_with(X=lambda d: d["X"].half()), "X: expected dtype"),
    "n = 3": (_with(X=lambda d: d["X"][:, :3]), "stream dimension"),
    "C = 0": (_with(X=lambda d: d["X"][..., :0]), "last dimension"),
    "X not last-dim contiguous": (_with(X=lambda d: d["X"].transpose(0, 2)),
                                  "X: last dimension must be contiguous"),
    "X strided last dim": (_with(X=lambda d: torch.cat([d["X"], d["X"]], -1)[..., ::2]),
                           "X: last dimension must be contiguous"),
    "phi shape": (_with(phi=lambda d: d["phi"][:-1]), r"phi: expected shape \[64, 24\]"),
    "phi bf16": (_with(phi=lambda d: d["phi"].bfloat16()), "phi: expected dtype"),
    "phi transposed": (_with(phi=lambda d: d["phi"].t().contiguous().t()),
                       "phi: must be contiguous"),
    "alpha shape": (_with(alpha=lambda d: d["alpha"][:2]), "alpha: expected shape"),
    "alpha dtype": (_with(alpha=lambda d: d["alpha"].double()), "alpha: expected dtype"),
    "bias shape": (_with(bias=lambda d: d["bias"][:-1]), "bias: expected shape"),
    "bias dtype": (_with(bias=lambda d: d["bias"].half()), "bias: expected dtype"),
    "devices differ": (_with(bias=lambda d: torch.zeros(24, device="meta")), "bias: on meta"),
    "eps 0": (_with(eps=0.0), "eps"),
    "eps nan": (_with(eps=float("nan")), "eps"),
    "iters 0": (_with(sinkhorn_iters=0), "sinkhorn_iters"),
    "iters float": (_with(sinkhorn_iters=2.0), "sinkhorn_iters"),
    "iters bool": (_with(sinkhorn_iters=True), "sinkhorn_iters"),
    "iters 101": (_with(sinkhorn_iters=101), "sinkhorn_iters"),
}


def _cpu_tensors(d):
    return [v for v in d.values() if isinstance(v, torch.Tensor) and v.device.type != "meta"]


@pytest.mark.parametrize("case", list(PREPARE))
def test_prepare_bad_input_raises_before_launch(case, no_launch):
    make_args, msg = PREPARE[case]
    d = make_args()
    before = [t.clone() for t in _cpu_tensors(d)]
    with pytest.raises(ValueError, match=msg):
        mhc_det_prepare(d.pop("X"), d.pop("phi"), d.pop("alpha"), d.pop("bias"), **d)
    assert all(bitwise_equal(a, b) for a, b in zip(before, _cpu_tensors(make_args()),
                                                   strict=True))


def test_finish_bad_inputs_raise_before_launch(monkeypatch):
    d = _base()
    U, h = mhc_det_prepare(d["X"], d["phi"], d["alpha"], d["bias"])

    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(api, "_launch_finish_fwd", boom)
    X = d["X"]
    before = [X.clone(), U.clone()]
    bad = {
        "X shape": ((X[:5], U[:5], h), "X: expected shape"),
        "X dtype": ((X.bfloat16(), U.bfloat16(), h), "X: expected dtype"),
        "B shape": ((X, U[:, :8], h), "B: expected shape"),
        "B dtype": ((X, U.bfloat16(), h), "B: expected dtype"),
        "B strided": ((X, torch.cat([U, U], -1)[:, ::2], h), "B: last dimension"),
        "B device": ((X, torch.zeros(6, 16, device="meta"), h), "B: on meta"),
        "handle": ((X, U, None), "handle: got NoneType"),
    }
    for (args, msg) in bad.values():
        with pytest.raises(ValueError, match=msg):
            mhc_det_finish(*args)
    assert bitwise_equal(before[0], X) and bitwise_equal(before[1], U)


def test_launch_device_check():
    if DEV.type != "cpu":
        pytest.skip("interpreter-only check")
    # meta tensors everywhere: same device, but not one the interpreter runs on
    d = {k: v.to("meta") for k, v in _base().items()}
    with pytest.raises(ValueError, match="X: on meta"):
        mhc_det_prepare(d["X"], d["phi"], d["alpha"], d["bias"])
