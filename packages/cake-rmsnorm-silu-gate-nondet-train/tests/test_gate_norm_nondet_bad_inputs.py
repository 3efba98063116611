"""Bad inputs raise ValueError before any launch (the det package's checks, run by this
package's entries) and leave the caller's tensors as they were."""

import cake_rmsnorm_silu_gate_det_train.api as det_api
import pytest
import torch
from _gate_norm_nd_cases import DEV
from cake_core.testing import assert_raises_unmodified, randn
from cake_rmsnorm_silu_gate_nondet_train import (
    RMSNormGatedNondet,
    make_nondet_plan,
    rmsnorm_silu_gate_nondet,
    rmsnorm_silu_gate_nondet_bwd,
    rmsnorm_silu_gate_nondet_fwd,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(det_api, "_launch_fwd", boom)
    monkeypatch.setattr(det_api, "_launch_bwd", boom)


def _t(shape=(4, 16), dtype=torch.float32, seed=5):
    return randn(shape, dtype, DEV, seed=seed)


def _base(**kw):
    return {"x": _t(), "z": _t(seed=6), "weight": _t((16,), seed=7), **kw}


CASES = {
    "z shape": (_base(z=_t((4, 8))), "z: expected shape"),
    "z dtype": (_base(z=_t(dtype=torch.bfloat16)), "z: expected dtype"),
    "weight wrong shape": (_base(weight=_t((15,))), r"weight: expected shape \[16\]"),
    "group_size not dividing": (_base(group_size=5), "group_size"),
    "activation": (_base(activation="relu"), "activation"),
    "norm_before_gate not bool": (_base(norm_before_gate=1), "norm_before_gate"),
    "eps 0": (_base(eps=0.0), "eps"),
    "plan of another group size": (_base(group_size=8,
                                         plan=make_nondet_plan(16, torch.float32, DEV)),
                                   "plan: made for hidden_size=16, group_size=16"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    kwargs, msg = CASES[case]
    assert_raises_unmodified(rmsnorm_silu_gate_nondet, kwargs, msg)


def test_low_level_bad_inputs(monkeypatch):
    a = _base()
    _, saved = rmsnorm_silu_gate_nondet_fwd(a["x"], a["z"], a["weight"])
    monkeypatch.setattr(det_api, "_launch_bwd", lambda *x, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match="dy: expected shape"):
        rmsnorm_silu_gate_nondet_bwd(_t((4, 8)), saved)
    saved.meta["activation"] = "tanh"
    with pytest.raises(ValueError, match="saved: meta 'activation'"):
        rmsnorm_silu_gate_nondet_bwd(torch.ones_like(a["x"]), saved)
    with pytest.raises(ValueError, match="saved: got dict"):
        rmsnorm_silu_gate_nondet_bwd(torch.ones_like(a["x"]), {"x": a["x"]})


def test_module_and_rule_refusals():
    with pytest.raises(ValueError, match="activation"):
        RMSNormGatedNondet(16, activation="gelu")
    with pytest.raises(ValueError, match="hidden_size"):
        RMSNormGatedNondet(16)(_t((4, 8)), _t((4, 8)))
    with pytest.raises(ValueError, match="group_size"):
        make_nondet_plan(16, torch.float32, DEV, group_size=3)
    with pytest.raises(ValueError, match="hidden_size"):
        make_nondet_plan(0, torch.float32, DEV)
