"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_rmsnorm_det_train.api as api
import pytest
import torch
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import rmsnorm_det

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(api, "_launch_fwd", boom)
    monkeypatch.setattr(api, "_launch_bwd", boom)


def _x(shape=(4, 16), dtype=torch.float32):
    return randn(shape, dtype, DEV, seed=5)


CASES = {
    "x 0-D": (lambda: (_x(()), _x((1,))), {}, "x: expected at least 1-D"),
    "x int": (lambda: (_x().to(torch.int32), _x((16,))), {}, "x: expected dtype"),
    "x float64": (lambda: (_x().double(), _x((16,))), {}, "x: expected dtype"),
    "weight dtype mismatch": (lambda: (_x(dtype=torch.bfloat16), _x((16,), torch.float16)),
                              {}, "weight: expected dtype"),
    "weight wrong shape": (lambda: (_x(), _x((15,))), {}, r"weight: expected shape \[16\]"),
    "weight 2-D": (lambda: (_x(), _x((1, 16))), {}, "weight: expected shape"),
    "devices differ": (lambda: (_x(), torch.ones(16, device="meta")), {}, "weight: on meta"),
    "last dim not contiguous": (lambda: (_x((16, 16)).t(), _x((16,))), {},
                                "x: last dimension must be contiguous"),
    "H = 0": (lambda: (_x((4, 0)), _x((0,))), {}, "last dimension"),
    "eps 0": (lambda: (_x(), _x((16,))), {"eps": 0.0}, "eps"),
    "eps negative": (lambda: (_x(), _x((16,))), {"eps": -1e-6}, "eps"),
    "eps nan": (lambda: (_x(), _x((16,))), {"eps": float("nan")}, "eps"),
    "offset nan": (lambda: (_x(), _x((16,))), {"offset": float("nan")}, "offset"),
    "offset inf": (lambda: (_x(), _x((16,))), {"offset": float("-inf")}, "offset"),
    "offset str": (lambda: (_x(), _x((16,))), {"offset": "1"}, "offset"),
    "offset beyond fp32": (lambda: (_x(), _x((16,))), {"offset": 1e39}, "offset: .*fp32"),
    "offset int beyond float": (lambda: (_x(), _x((16,))), {"offset": 10**400}, "offset"),
    "offset bool": (lambda: (_x(), _x((16,))), {"offset": True}, "offset"),
    "residual shape": (lambda: (_x(), _x((16,))), {"residual": _x((4, 8))}, "residual"),
    "residual dtype": (lambda: (_x(), _x((16,))), {"residual": _x(dtype=torch.float16)},
                       "residual: expected dtype"),
    "accumulator dtype": (lambda: (_x(), _x((16,))),
                          {"dweight_accumulator": _x((16,), torch.bfloat16)},
                          "dweight_accumulator: expected dtype"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    make, kw, msg = CASES[case]
    x, w = make()
    before = [t.clone() for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
              and t.device.type != "meta"]
    with pytest.raises(ValueError, match=msg):
        rmsnorm_det(x, w, **kw)
    after = [t for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
             and t.device.type != "meta"]
    assert all(bitwise_equal(a, b) for a, b in zip(before, after, strict=True))


def test_wrong_backend_device_refused(no_launch):
    other = "cuda" if DEV.type == "cpu" else "cpu"
    if other == "cuda" and not torch.cuda.is_available():
        x, w = torch.ones(2, 4, device="meta"), torch.ones(4, device="meta")
        with pytest.raises(ValueError, match="x: on meta"):
            rmsnorm_det(x, w)
        return
    with pytest.raises(ValueError, match="x: on"):
        rmsnorm_det(torch.ones(2, 4, device=other), torch.ones(4, device=other))


def test_non_tensor_inputs(no_launch):
    with pytest.raises(ValueError, match="x: expected a torch.Tensor"):
        rmsnorm_det([[1.0]], _x((1,)))
    with pytest.raises(ValueError, match="weight: expected a torch.Tensor"):
        rmsnorm_det(_x(), None)
