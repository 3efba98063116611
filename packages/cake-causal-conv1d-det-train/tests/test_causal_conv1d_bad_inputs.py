"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_causal_conv1d_det_train.api as api
import pytest
import torch
from cake_causal_conv1d_det_train import (
    causal_conv1d_det,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
)
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device

DEV = default_device()
B, T, D, W = 2, 10, 8, 4


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(api, "_launch_fwd", boom)
    monkeypatch.setattr(api, "_launch_bwd", boom)


def _t(shape, dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


def _cu(*v, dtype=torch.int32):
    return torch.tensor(v, dtype=dtype, device=DEV)


def _base():
    return _t((B, T, D)), _t((D, W), seed=6)


def _packed():
    return _t((1, T, D)), _t((D, W), seed=6)


CASES = {
    "x 2-D": (lambda: (_t((T, D)), _t((D, W))), {},
              r"x: expected 3-D tensor \(\[B, T, D\], FLA's layout; channel-first \[B, D, T\] "
              r"\(causal-conv1d's causal_conv1d_fn\) is not served\)"),
    # channel-first x [B, D, T] reads as D = 10 channels: the weight's check says why
    "x channel-first": (lambda: (_t((B, D, T)), _t((D, W))), {},
                        r"weight: expected shape \[10, W\] \(\[D, W\]: .* \(x is \[B, T, D\], "
                        r"FLA's layout; channel-first \[B, D, T\] is not served\)\), got \[8, 4\]"),
    "x int": (lambda: (_t((B, T, D)).to(torch.int32), _t((D, W))), {}, "x: expected dtype"),
    "x float64": (lambda: (_t((B, T, D)).double(), _t((D, W))), {}, "x: expected dtype"),
    "x channels strided": (lambda: (_t((B, D, T)).transpose(1, 2), _t((D, W))), {},
                           "x: last dimension must be contiguous"),
    "D = 0": (lambda: (_t((B, T, 0)), _t((0, W))), {}, r"x: channels D"),
    "W = 1": (lambda: (_t((B, T, D)), _t((D, 1))), {}, r"weight: kernel size W must be in"),
    "W = 9": (lambda: (_t((B, T, D)), _t((D, 9))), {}, r"weight: kernel size W must be in"),
    "weight wrong D": (lambda: (_t((B, T, D)), _t((D + 1, W))), {},
                       r"weight: expected shape \[8, W\]"),
    "weight conv layout": (lambda: (_t((B, T, D)), _t((D, 1, W))), {},
                           r"weight: expected shape \[8, W\]"),
    "weight dtype": (lambda: (_t((B, T, D), torch.bfloat16), _t((D, W), torch.float16)), {},
                     "weight: expected dtype"),
    "weight strided": (lambda: (_t((B, T, D)), _t((W, D)).t()), {},
                       "weight: last dimension must be contiguous"),
    "bias shape": (_base, {"bias": _t((D + 1,))}, r"bias: expected shape \[8\]"),
    "bias dtype": (_base, {"bias": _t((D,), torch.float16)}, "bias: expected dtype"),
    "activation gelu": (_base, {"activation": "gelu"}, "activation"),
    "activation bool": (_base, {"activation": True}, "activation"),
    "output_final_state str": (_base, {"output_final_state": "yes"}, "output_final_state"),
    "initial_state wrong N": (_base, {"initial_state": _t((B + 1, D, W - 1))},
                              r"initial_state: expected shape \[2, 8, 3\]"),
    "initial_state FLA width": (_base, {"initial_state": _t((B, D, W))},
                                r"initial_state: expected shape \[2, 8, 3\]"),
    "initial_state dtype": (_base, {"initial_state": _t((B, D, W - 1), torch.bfloat16)},
                            "initial_state: expected dtype"),
    "initial_state list": (_base, {"initial_state": [[0.0]]}, "initial_state: expected a"),
    "initial_state N of docs": (_packed, {"cu_seqlens": _cu(0, 4, 10),
                                          "initial_state": _t((1, D, W - 1))},
                                r"initial_state: expected shape \[2, 8, 3\]"),
    "cu_seqlens with B > 1": (_base, {"cu_seqlens": _cu(0, 4, 10)}, "need B == 1"),
    "cu_seqlens unsorted": (_packed, {"cu_seqlens": _cu(0, 6, 4, 10)}, "non-decreasing"),
    "cu_seqlens short end": (_packed, {"cu_seqlens": _cu(0, 4, 9)}, "must end at"),
    "cu_seqlens past end": (_packed, {"cu_seqlens": _cu(0, 4, 11)}, "must end at"),
    "cu_seqlens start": (_packed, {"cu_seqlens": _cu(1, 4, 10)}, "must start at 0"),
    "cu_seqlens float": (_packed, {"cu_seqlens": _cu(0, 4, 10, dtype=torch.float32)},
                         "cu_seqlens: expected dtype"),
    "cu_seqlens 2-D": (_packed, {"cu_seqlens": _cu(0, 4, 10).reshape(1, 3)},
                       "cu_seqlens: expected 1-D"),
    "devices differ": (lambda: (_t((B, T, D)), torch.ones(D, W, device="meta")), {},
                       "weight: on meta"),
}


def _tensors(*objs):
    return [t for t in objs if isinstance(t, torch.Tensor) and t.device.type != "meta"]


@pytest.mark.parametrize("entry", ["autograd", "fwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, entry, no_launch):
    make, kw, msg = CASES[case]
    x, w = make()
    before = [t.clone() for t in _tensors(x, w, *kw.values())]
    fn = causal_conv1d_det if entry == "autograd" else causal_conv1d_det_fwd
    with pytest.raises(ValueError, match=msg):
        fn(x, w, **kw)
    after = _tensors(x, w, *kw.values())
    assert all(bitwise_equal(a, b) for a, b in zip(before, after, strict=True))


def test_non_tensor_inputs(no_launch):
    with pytest.raises(ValueError, match="x: expected a torch.Tensor"):
        causal_conv1d_det([[1.0]], _t((D, W)))
    with pytest.raises(ValueError, match="weight: expected a torch.Tensor"):
        causal_conv1d_det(_t((B, T, D)), None)


def test_wrong_backend_device_refused(no_launch):
    x, w = torch.ones(1, 2, 4, device="meta"), torch.ones(4, 2, device="meta")
    with pytest.raises(ValueError, match="x: on meta"):
        causal_conv1d_det(x, w)


def test_bad_backward_inputs():
    x, w = _base()
    y, _, saved = causal_conv1d_det_fwd(x, w, initial_state=_t((B, D, W - 1)),
                                        output_final_state=True)
    dy = torch.ones_like(y)

    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    api_launch, api._launch_bwd = api._launch_bwd, boom
    try:
        for kw, msg in (
            (dict(dy=dy[:, :-1]), r"dy: expected shape \[2, 10, 8\]"),
            (dict(dy=dy.to(torch.int32)), "dy: expected dtype"),
            (dict(dy=torch.ones(B, D, T).transpose(1, 2)), "dy: last dimension"),
            (dict(dfinal_state=torch.ones(B, D, W)), r"dfinal_state: expected shape"),
            (dict(dfinal_state=torch.ones(B, D, W - 1, dtype=torch.float64)),
             "dfinal_state: expected dtype"),
            (dict(dy=torch.ones(B, T, D, device="meta")), "dy: on meta"),
        ):
            args = dict(dy=dy, dfinal_state=None) | kw
            with pytest.raises(ValueError, match=msg):
                causal_conv1d_det_bwd(args["dy"], args["dfinal_state"], saved)
    finally:
        api._launch_bwd = api_launch
