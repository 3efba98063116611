"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet agree with the entry's
checks and with what the forward and RMSNormNondetWorkspace.for_plan allocate (issue 45)."""

import cake_rmsnorm_det_train.api as det_api
import pytest
import torch
from _rmsnorm_nd_cases import DEV
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_rmsnorm_det_train import RMSNormDetWorkspace, make_plan
from cake_rmsnorm_nondet_train import (
    RMSNormNondetWorkspace,
    is_supported_nondet,
    make_nondet_plan,
    rmsnorm_nondet,
    rmsnorm_nondet_fwd,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)
from test_rmsnorm_nondet_bad_inputs import CASES


@pytest.mark.parametrize("H", [1, 7, 100, 257, 4096, 65536])
def test_workspace_bytes_is_for_plan_nbytes(H):
    plan = make_nondet_plan(H, torch.float32, DEV)
    assert workspace_bytes_nondet(plan) == RMSNormNondetWorkspace.for_plan(plan, DEV).nbytes
    assert workspace_bytes_nondet(plan, DEV) == workspace_bytes_nondet(plan)


def test_workspace_bytes_refuses_a_det_plan():
    det = make_plan(16, torch.float32, DEV)
    with pytest.raises(ValueError) as err:
        RMSNormNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as err2:
        workspace_bytes_nondet(det)
    assert str(err.value) == str(err2.value)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 100), (0, 16), (17, 257)], ids=str)
def test_saved_bytes_is_what_the_forward_keeps(shape, residual):
    x = randn(shape, torch.bfloat16, DEV, seed=1)
    w = randn(shape[-1:], torch.float32, DEV, seed=2)
    r = randn(shape, torch.bfloat16, DEV, seed=3) if residual else None
    _, saved = rmsnorm_nondet_fwd(x, w, residual=r)
    want = owned_nbytes(saved.tensors(), exclude=[x, w, r])
    assert saved_bytes_nondet(x, w, residual=r) == want
    meta = [t.to("meta") if t is not None else None for t in (x, w, r)]
    assert saved_bytes_nondet(meta[0], meta[1], residual=meta[2]) == want


def test_is_supported_true_on_a_valid_call():
    x, w = randn((4, 16), torch.float32, DEV), randn((16,), torch.float32, DEV)
    plan = make_nondet_plan(16, torch.float32, DEV)
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        s = is_supported_nondet(x, w, residual=x.clone(), plan=plan,
                                workspace=RMSNormNondetWorkspace.for_plan(plan, DEV))
    assert s == (True, "")


def _bad_calls():
    for name, (kwargs, _) in CASES.items():
        yield name, kwargs
    x, w = randn((4, 16), torch.float32, DEV), randn((16,), torch.float32, DEV)
    det = make_plan(16, torch.float32, DEV)
    yield "det plan", {"x": x, "weight": w, "plan": det}
    yield "det workspace", {"x": x, "weight": w,
                            "workspace": RMSNormDetWorkspace.for_plan(det, DEV)}


@pytest.mark.parametrize("name,kwargs", list(_bad_calls()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_is_supported_false_with_the_entrys_message(name, kwargs):
    keep = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            rmsnorm_nondet(**kwargs)
        s = is_supported_nondet(**kwargs)
        with pytest.raises(ValueError) as err2:
            saved_bytes_nondet(**kwargs)
    assert s == (False, str(err.value)) and str(err2.value) == str(err.value)
    assert all(bitwise_equal(v, kwargs[k]) for k, v in keep.items())
