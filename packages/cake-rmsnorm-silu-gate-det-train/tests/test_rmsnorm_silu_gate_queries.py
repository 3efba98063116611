"""is_supported / workspace_bytes / saved_bytes agree with the entry's checks and with what
the forward and RMSNormSiluGateDetWorkspace.for_plan allocate (issue 45)."""

import importlib.util
from pathlib import Path

import cake_rmsnorm_silu_gate_det_train.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetPlan,
    RMSNormSiluGateDetWorkspace,
    is_supported,
    make_plan,
    rmsnorm_silu_gate_det,
    rmsnorm_silu_gate_det_fwd,
    saved_bytes,
    workspace_bytes,
)

DEV = default_device()


def _bad_input_cases():
    """The bad inputs of test_rmsnorm_silu_gate_bad_inputs.py (loaded by path)."""
    path = Path(__file__).with_name("test_rmsnorm_silu_gate_bad_inputs.py")
    spec = importlib.util.spec_from_file_location("_silu_gate_bad_inputs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = _bad_input_cases()


def _plans():
    for D, G in ((1, 1), (7, 7), (100, 25), (256, 64), (4096, 4096), (65536, 65536)):
        yield make_plan(D, torch.float32, DEV, group_size=G)
        yield make_plan(D, torch.bfloat16, "cpu", group_size=G)
    yield RMSNormSiluGateDetPlan.from_dict(
        {**make_plan(48, torch.float32, DEV, group_size=16).to_dict(), "bwd_programs": 11})


@pytest.mark.parametrize("plan", list(_plans()), ids=str)
def test_workspace_bytes_is_for_plan_nbytes(plan):
    assert workspace_bytes(plan) == RMSNormSiluGateDetWorkspace.for_plan(plan, DEV).nbytes
    assert workspace_bytes(plan, DEV) == workspace_bytes(plan)


def test_workspace_bytes_bad_plan():
    with pytest.raises(ValueError, match="plan: expected RMSNormSiluGateDetPlan"):
        workspace_bytes(None)


@pytest.mark.parametrize("shape,G", [((1, 1), None), ((3, 7), None), ((2, 3, 100), 25),
                                     ((0, 16), 4), ((17, 96), 32), ((5, 33), 11)], ids=str)
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_saved_bytes_is_what_the_forward_keeps(shape, G, norm_before_gate):
    x = randn(shape, torch.bfloat16, DEV, seed=1)
    z = randn(shape, torch.bfloat16, DEV, seed=2)
    w = randn(shape[-1:], torch.float32, DEV, seed=3)
    kw = {"group_size": G, "norm_before_gate": norm_before_gate}
    _, saved = rmsnorm_silu_gate_det_fwd(x, z, w, **kw)
    want = owned_nbytes(saved.tensors(), exclude=[x, z, w])
    assert saved_bytes(x, z, w, **kw) == want
    assert saved_bytes(x.to("meta"), z.to("meta"), w.to("meta"), **kw) == want


def test_is_supported_true_on_valid_calls():
    x, z, w = (randn(s, torch.float32, DEV, seed=i) for i, s in
               enumerate([(4, 16), (4, 16), (16,)]))
    plan = make_plan(16, torch.float32, DEV, group_size=8)
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        assert is_supported(x, z, w)
        s = is_supported(x, z, w, 1e-5, norm_before_gate=False, group_size=8,
                         activation="sigmoid", plan=plan,
                         workspace=RMSNormSiluGateDetWorkspace.for_plan(plan, DEV),
                         dweight_accumulator=torch.zeros(16, device=DEV))
    assert s == (True, "")


def _bad_calls():
    for name, (make, kw, _) in CASES.items():
        yield name, make, kw
    ok = lambda: tuple(randn(s, torch.float32, DEV, seed=i)  # noqa: E731
                       for i, s in enumerate([(4, 16), (4, 16), (16,)]))
    yield "plan for another G", ok, {"plan": make_plan(16, torch.float32, DEV, group_size=8)}
    yield "workspace of another plan", ok, {"workspace": RMSNormSiluGateDetWorkspace.for_plan(
        make_plan(8, torch.float32, DEV), DEV)}


@pytest.mark.parametrize("name,make,kw", list(_bad_calls()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_is_supported_false_with_the_entrys_message(name, make, kw):
    args = make()
    tensors = [t for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)
               and t.device.type != "meta"]
    keep = [t.clone() for t in tensors]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            rmsnorm_silu_gate_det(*args, **kw)
        s = is_supported(*args, **kw)
    assert not s and s == (False, str(err.value))
    assert all(bitwise_equal(a, b) for a, b in zip(keep, tensors, strict=True))
    if not any(isinstance(t, torch.Tensor) and t.device.type == "meta"
               for t in (*args, *kw.values())):
        with pytest.raises(ValueError) as err2:
            saved_bytes(*args, **kw)
        assert str(err2.value) == str(err.value)
