"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_rmsnorm_silu_gate_det_train.api as api
import pytest
import torch
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import (
    rmsnorm_silu_gate_det,
    rmsnorm_silu_gate_det_bwd,
    rmsnorm_silu_gate_det_fwd,
)

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(api, "_launch_fwd", boom)
    monkeypatch.setattr(api, "_launch_bwd", boom)


def _t(shape=(4, 16), dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


def _ok():
    return _t(), _t(seed=6), _t((16,), seed=7)


CASES = {
    "x not a tensor": (lambda: ([[1.0]], _t((1, 1)), _t((1,))), {},
                       "x: expected a torch.Tensor"),
    "x 0-D": (lambda: (_t(()), _t(()), _t((1,))), {}, "x: expected at least 1-D"),
    "x int": (lambda: (_t().to(torch.int32), _t(), _t((16,))), {}, "x: expected dtype"),
    "x float64": (lambda: (_t().double(), _t().double(), _t((16,))), {}, "x: expected dtype"),
    "D = 0": (lambda: (_t((4, 0)), _t((4, 0)), _t((0,))), {}, "last dimension"),
    "x last dim not contiguous": (lambda: (_t((16, 4)).t(), _t(), _t((16,))), {},
                                  "x: last dimension must be contiguous"),
    "z not a tensor": (lambda: (_t(), None, _t((16,))), {}, "z: expected a torch.Tensor"),
    "z shape mismatch": (lambda: (_t(), _t((4, 8)), _t((16,))), {}, r"z: expected shape \[4, 16\]"),
    "z broadcastable but not equal": (lambda: (_t(), _t((1, 16)), _t((16,))), {},
                                      "z: expected shape"),
    "z dtype mismatch": (lambda: (_t(), _t(dtype=torch.bfloat16), _t((16,))), {},
                         "z: expected dtype"),
    "z last dim not contiguous": (lambda: (_t(), _t((16, 4)).t(), _t((16,))), {},
                                  "z: last dimension must be contiguous"),
    "weight wrong shape": (lambda: (_t(), _t(), _t((15,))), {}, r"weight: expected shape \[16\]"),
    "weight 2-D": (lambda: (_t(), _t(), _t((1, 16))), {}, "weight: expected shape"),
    "weight dtype": (lambda: (_t(dtype=torch.bfloat16), _t(dtype=torch.bfloat16),
                              _t((16,), torch.float16)), {}, "weight: expected dtype"),
    "weight strided": (lambda: (_t(), _t(), _t((32,))[::2]), {},
                       "weight: last dimension must be contiguous"),
    "devices differ": (lambda: (_t(), _t(), torch.ones(16, device="meta")), {},
                       "weight: on meta"),
    "eps 0": (lambda: _ok(), {"eps": 0.0}, "eps"),
    "eps negative": (lambda: _ok(), {"eps": -1e-6}, "eps"),
    "eps nan": (lambda: _ok(), {"eps": float("nan")}, "eps"),
    "eps inf": (lambda: _ok(), {"eps": float("inf")}, "eps"),
    "group_size not dividing D": (lambda: _ok(), {"group_size": 5}, "group_size"),
    "group_size 0": (lambda: _ok(), {"group_size": 0}, "group_size"),
    "group_size > D": (lambda: _ok(), {"group_size": 32}, "group_size"),
    "group_size float": (lambda: _ok(), {"group_size": 8.0}, "group_size"),
    "group_size bool": (lambda: _ok(), {"group_size": True}, "group_size"),
    "norm_before_gate not bool": (lambda: _ok(), {"norm_before_gate": "yes"},
                                  "norm_before_gate"),
    "activation relu": (lambda: _ok(), {"activation": "relu"}, "activation: expected one of"),
    "activation upper case": (lambda: _ok(), {"activation": "SiLU"}, "activation"),
    "activation None": (lambda: _ok(), {"activation": None}, "activation"),
    "activation list": (lambda: _ok(), {"activation": ["silu"]}, "activation"),
    "accumulator dtype": (lambda: _ok(), {"dweight_accumulator": _t((16,), torch.bfloat16)},
                          "dweight_accumulator: expected dtype"),
    "accumulator shape": (lambda: _ok(), {"dweight_accumulator": _t((4, 16))},
                          "dweight_accumulator: expected shape"),
}


# the low-level forward takes no accumulator
ENTRY_CASES = [("autograd", c) for c in CASES] + [
    ("fwd", c) for c in CASES if "dweight_accumulator" not in CASES[c][1]]


@pytest.mark.parametrize("entry,case", ENTRY_CASES, ids=[f"{e}-{c}" for e, c in ENTRY_CASES])
def test_bad_input_raises_before_launch(case, entry, no_launch):
    make, kw, msg = CASES[case]
    x, z, w = make()
    fn = rmsnorm_silu_gate_det_fwd if entry == "fwd" else rmsnorm_silu_gate_det
    tensors = [t for t in (x, z, w, *kw.values()) if isinstance(t, torch.Tensor)
               and t.device.type != "meta"]
    before = [t.clone() for t in tensors]
    with pytest.raises(ValueError, match=msg):
        fn(x, z, w, **kw)
    assert all(bitwise_equal(a, b) for a, b in zip(before, tensors, strict=True))


def test_bad_backward_inputs_raise_before_launch(monkeypatch):
    x, z, w = _ok()
    y, saved = rmsnorm_silu_gate_det_fwd(x, z, w)
    monkeypatch.setattr(api, "_launch_bwd",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    for dy, msg in ((y[:2], "dy: expected shape"), (y.double(), "dy: expected dtype"),
                    (None, "dy: expected a torch.Tensor"),
                    (torch.ones(4, 16, device="meta"), "dy: on meta")):
        with pytest.raises(ValueError, match=msg):
            rmsnorm_silu_gate_det_bwd(dy, saved)


def test_bad_activation_refused_by_module_reference_saved_set_and_ops(no_launch):
    """Outside the entry points too: the module's constructor, the reference, a saved set
    whose meta lost its gate, and the custom ops called directly."""
    from cake_core.compile import plan_to_op_fields
    from cake_rmsnorm_silu_gate_det_train import (
        RMSNormGated,
        make_plan,
        rmsnorm_silu_gate_reference,
    )

    x, z, w = _ok()
    with pytest.raises(ValueError, match="activation"):
        RMSNormGated(16, activation="gelu")
    with pytest.raises(ValueError, match="activation"):
        rmsnorm_silu_gate_reference(x, z, w, activation="tanh")
    fields = plan_to_op_fields(make_plan(16, torch.float32, DEV))
    with pytest.raises(ValueError, match="activation"):
        torch.ops.cake_rmsnorm_silu_gate_det_train.fwd(x, z, w, 1e-6, True, "relu", fields,
                                                       None, None)
    rstd = torch.ones(4, 1, device=DEV)
    with pytest.raises(ValueError, match="activation"):
        torch.ops.cake_rmsnorm_silu_gate_det_train.bwd(x, x, z, w, rstd, True, "relu", fields,
                                                       None, None)


def test_saved_set_without_a_valid_activation_refused(monkeypatch):
    x, z, w = _ok()
    y, saved = rmsnorm_silu_gate_det_fwd(x, z, w, activation="sigmoid")
    monkeypatch.setattr(api, "_launch_bwd",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    for bad in (None, "relu"):
        if bad is None:
            del saved.meta["activation"]
        else:
            saved.meta["activation"] = bad
        with pytest.raises(ValueError, match="saved: meta 'activation'"):
            rmsnorm_silu_gate_det_bwd(torch.ones_like(y), saved)


def test_wrong_backend_device_refused(no_launch):
    other = "cuda" if DEV.type == "cpu" else "cpu"
    if other == "cuda" and not torch.cuda.is_available():
        x = torch.ones(2, 4, device="meta")
        with pytest.raises(ValueError, match="x: on meta"):
            rmsnorm_silu_gate_det(x, x, torch.ones(4, device="meta"))
        return
    x = torch.ones(2, 4, device=other)
    with pytest.raises(ValueError, match="x: on"):
        rmsnorm_silu_gate_det(x, x, torch.ones(4, device=other))


def test_padded_row_too_large(no_launch):
    # D = 3 * 21845 = 65535 in 3 groups: 4 x 32768 padded elements per row
    x = torch.zeros(1, 65535)
    with pytest.raises(ValueError, match="pads to a 4x32768 row tile"):
        rmsnorm_silu_gate_det(x, x, torch.ones(65535), group_size=21845)
