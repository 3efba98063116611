"""is_supported / workspace_bytes / saved_bytes agree with the entry's checks and with what
the forward and RMSNormDetWorkspace.for_plan allocate (issue 45)."""

import importlib.util
from pathlib import Path

import cake_rmsnorm_det_train.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import (
    RMSNormDetPlan,
    RMSNormDetWorkspace,
    is_supported,
    make_plan,
    rmsnorm_det,
    rmsnorm_det_fwd,
    saved_bytes,
    workspace_bytes,
)


def _bad_input_cases():
    """The bad inputs of test_rmsnorm_bad_inputs.py (loaded by path: no conftest here)."""
    path = Path(__file__).with_name("test_rmsnorm_bad_inputs.py")
    spec = importlib.util.spec_from_file_location("_rmsnorm_bad_inputs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = _bad_input_cases()

DEV = default_device()
SHAPES = [(1, 1), (3, 7), (5, 33), (2, 3, 100), (0, 16), (17, 257), (4, 1000)]


def _plans():
    for H in (1, 7, 100, 257, 4096, 65536):
        yield make_plan(H, torch.float32, DEV)
        yield make_plan(H, torch.bfloat16, "cuda" if DEV.type == "cuda" else "cpu")
    yield RMSNormDetPlan.from_dict({**make_plan(33, torch.float32, DEV).to_dict(),
                                    "bwd_programs": 13})


@pytest.mark.parametrize("plan", list(_plans()), ids=str)
def test_workspace_bytes_is_for_plan_nbytes(plan):
    assert workspace_bytes(plan) == RMSNormDetWorkspace.for_plan(plan, DEV).nbytes
    assert workspace_bytes(plan, DEV) == workspace_bytes(plan)


def test_workspace_bytes_bad_plan():
    with pytest.raises(ValueError, match="plan: expected RMSNormDetPlan"):
        workspace_bytes("plan")


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_bytes_is_what_the_forward_keeps(shape, dtype, residual):
    x = randn(shape, dtype, DEV, seed=1)
    w = randn(shape[-1:], dtype, DEV, seed=2)
    r = randn(shape, dtype, DEV, seed=3) if residual else None
    _, saved = rmsnorm_det_fwd(x, w, residual=r)
    want = owned_nbytes(saved.tensors(), exclude=[x, w, r])
    assert saved_bytes(x, w, residual=r) == want
    meta = [t.to("meta") if t is not None else None for t in (x, w, r)]
    assert saved_bytes(meta[0], meta[1], residual=meta[2]) == want


def test_saved_bytes_bad_input_raises_the_entrys_error():
    x, w = randn((4, 16), torch.float32, DEV), randn((15,), torch.float32, DEV)
    with pytest.raises(ValueError) as e1:
        rmsnorm_det(x, w)
    with pytest.raises(ValueError) as e2:
        saved_bytes(x, w)
    assert str(e1.value) == str(e2.value)


def test_is_supported_true_on_valid_calls():
    x, w = randn((4, 16), torch.float32, DEV), randn((16,), torch.float32, DEV)
    plan = make_plan(16, torch.float32, DEV)
    ws = RMSNormDetWorkspace.for_plan(plan, DEV)
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        assert is_supported(x, w)
        s = is_supported(x, w, 1e-5, residual=x.clone(), plan=plan, workspace=ws,
                         dweight_accumulator=torch.zeros(16, device=DEV))
    assert s.ok and s.reason == ""


def _bad_calls():
    for name, (make, kw, _) in CASES.items():
        yield name, make, kw
    x, w = randn((4, 16), torch.float32, DEV), randn((16,), torch.float32, DEV)
    yield "plan for another H", lambda: (x, w), {"plan": make_plan(8, torch.float32, DEV)}
    yield "workspace of another plan", lambda: (x, w), {
        "workspace": RMSNormDetWorkspace.for_plan(make_plan(8, torch.float32, DEV), DEV)}


@pytest.mark.parametrize("name,make,kw", list(_bad_calls()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_is_supported_false_with_the_entrys_message(name, make, kw):
    x, w = make()
    keep = [t.clone() for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
            and t.device.type != "meta"]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            rmsnorm_det(x, w, **kw)
        s = is_supported(x, w, **kw)
    assert not s and s == (False, str(err.value))
    after = [t for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
             and t.device.type != "meta"]
    assert all(bitwise_equal(a, b) for a, b in zip(keep, after, strict=True))
