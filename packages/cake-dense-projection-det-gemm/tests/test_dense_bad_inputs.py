"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_dense_projection_det_gemm.api as api
import pytest
import torch
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    Linear,
    dense_projection_det,
    dense_projection_det_bwd,
    dense_projection_det_fwd,
)

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_fwd", "_launch_bwd", "matmul"):
        monkeypatch.setattr(api, name, boom)


def _t(shape, dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


X, W = (4, 16), (8, 16)
CASES = {
    "x 0-D": (lambda: (_t(()), _t((8, 1))), {}, "x: expected at least 1-D"),
    "x int": (lambda: (_t(X).to(torch.int32), _t(W)), {}, "x: expected dtype"),
    "x float64": (lambda: (_t(X).double(), _t(W).double()), {}, "x: expected dtype"),
    "K = 0": (lambda: (_t((4, 0)), _t((8, 0))), {}, "x: last dimension"),
    "weight dtype mismatch": (lambda: (_t(X, torch.bfloat16), _t(W, torch.float16)), {},
                              "weight: expected dtype"),
    "weight fp32, x bf16": (lambda: (_t(X, torch.bfloat16), _t(W)), {},
                            "weight: expected dtype"),
    "weight wrong K": (lambda: (_t(X), _t((8, 15))), {}, r"weight: expected shape \[\*, 16\]"),
    "weight transposed": (lambda: (_t(X), _t((16, 8))), {},
                          r"weight: expected shape \[\*, 16\] \(\[N, K\] = \[out_features, "
                          r"in_features\], torch.nn.Linear's layout; a transposed \[K, N\] is "
                          r"not served\), got \[16, 8\]"),
    "weight 1-D": (lambda: (_t(X), _t((16,))), {}, "weight: expected 2-D"),
    "weight 3-D": (lambda: (_t(X), _t((1, 8, 16))), {}, "weight: expected 2-D"),
    "N = 0": (lambda: (_t(X), _t((0, 16))), {}, "weight: out_features"),
    "bias shape": (lambda: (_t(X), _t(W)), {"bias": _t((7,))}, r"bias: expected shape \[8\]"),
    "bias dtype": (lambda: (_t(X), _t(W)), {"bias": _t((8,), torch.float16)},
                   "bias: expected dtype"),
    "bias not a tensor": (lambda: (_t(X), _t(W)), {"bias": 1.0}, "bias: expected a torch"),
    "main_grad shape": (lambda: (_t(X), _t(W)), {"main_grad": _t((16, 8))},
                        r"main_grad: expected shape \[8, 16\]"),
    "main_grad dtype": (lambda: (_t(X, torch.bfloat16), _t(W, torch.bfloat16)),
                        {"main_grad": _t(W, torch.bfloat16)}, "main_grad: expected dtype"),
    "main_grad strided": (lambda: (_t(X), _t(W)), {"main_grad": _t((16, 8)).t()},
                          "main_grad: must be contiguous"),
    "devices differ": (lambda: (_t(X), torch.ones(W, device="meta")), {}, "weight: on meta"),
    "bias on other device": (lambda: (_t(X), _t(W)), {"bias": torch.ones(8, device="meta")},
                             "bias: on meta"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    make, kw, msg = CASES[case]
    x, w = make()
    tensors = [t for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
               and t.device.type != "meta"]
    before = [t.clone() for t in tensors]
    with pytest.raises(ValueError, match=msg):
        dense_projection_det(x, w, **kw)
    assert all(bitwise_equal(a, b) for a, b in zip(before, tensors, strict=True))
    if "main_grad" not in kw:
        with pytest.raises(ValueError, match=msg):
            dense_projection_det_fwd(x, w, **kw)


def test_bad_backward_inputs(monkeypatch):
    x, w, b = _t((5, 16)), _t(W), _t((8,))
    y, saved = dense_projection_det_fwd(x, w, b)
    TESTS = {
        "dy shape": ((_t((5, 7)),), {}, r"dy: expected shape \[5, 8\]"),
        "dy dtype": ((y.half(),), {}, "dy: expected dtype"),
        "dy not a tensor": ((None,), {}, "dy: expected a torch.Tensor"),
        "main_grad shape": ((y,), {"main_grad": _t((8, 15))}, "main_grad: expected shape"),
        "main_grad dtype": ((y,), {"main_grad": _t(W).double()}, "main_grad: expected dtype"),
        "main_grad device": ((y,), {"main_grad": torch.ones(W, device="meta")},
                             "main_grad: on meta"),
    }
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_bwd", "matmul"):
        monkeypatch.setattr(api, name, boom)
    for (args, kw, msg) in TESTS.values():
        keep = [t.clone() for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)
                and t.device.type != "meta"]
        with pytest.raises(ValueError, match=msg):
            dense_projection_det_bwd(*args, saved, **kw)
        again = [t for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)
                 and t.device.type != "meta"]
        assert all(bitwise_equal(a, c) for a, c in zip(keep, again, strict=True))


def test_wrong_backend_device_refused(no_launch):
    if DEV.type == "cpu" and not torch.cuda.is_available():
        x, w = torch.ones(2, 4, device="meta"), torch.ones(3, 4, device="meta")
        with pytest.raises(ValueError, match="x: on meta"):
            dense_projection_det(x, w)
        return
    other = "cuda" if DEV.type == "cpu" else "cpu"
    with pytest.raises(ValueError, match="x: on"):
        dense_projection_det(torch.ones(2, 4, device=other), torch.ones(3, 4, device=other))


def test_non_tensor_inputs(no_launch):
    with pytest.raises(ValueError, match="x: expected a torch.Tensor"):
        dense_projection_det([[1.0]], _t((1, 1)))
    with pytest.raises(ValueError, match="weight: expected a torch.Tensor"):
        dense_projection_det(_t(X), None)


def test_module_checks_in_features(no_launch):
    m = Linear(16, 8, device=DEV)
    with pytest.raises(ValueError, match="x: last dim must be in_features=16"):
        m(_t((4, 15)))
    with pytest.raises(ValueError, match="weight: expected dtype"):
        m(_t(X, torch.bfloat16))
