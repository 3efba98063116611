"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet agree with the entry's
checks and with what the forward and RMSNormSiluGateNondetWorkspace.for_plan allocate
(issue 45)."""

import cake_rmsnorm_silu_gate_det_train.api as det_api
import pytest
import torch
from _gate_norm_nd_cases import DEV
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetWorkspace, make_plan
from cake_rmsnorm_silu_gate_nondet_train import (
    RMSNormSiluGateNondetWorkspace,
    is_supported_nondet,
    make_nondet_plan,
    rmsnorm_silu_gate_nondet,
    rmsnorm_silu_gate_nondet_fwd,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)
from test_gate_norm_nondet_bad_inputs import CASES


@pytest.mark.parametrize("D,G", [(1, 1), (7, 7), (100, 25), (4096, 512), (65536, 65536)])
def test_workspace_bytes_is_for_plan_nbytes(D, G):
    plan = make_nondet_plan(D, torch.float32, DEV, group_size=G)
    assert workspace_bytes_nondet(plan) == \
        RMSNormSiluGateNondetWorkspace.for_plan(plan, DEV).nbytes
    assert workspace_bytes_nondet(plan, DEV) == workspace_bytes_nondet(plan)


def test_workspace_bytes_refuses_a_det_plan():
    det = make_plan(16, torch.float32, DEV)
    with pytest.raises(ValueError) as err:
        RMSNormSiluGateNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as err2:
        workspace_bytes_nondet(det)
    assert str(err.value) == str(err2.value)


@pytest.mark.parametrize("shape,G", [((1, 1), None), ((3, 7), None), ((2, 3, 100), 25),
                                     ((0, 16), 4), ((5, 33), 11)], ids=str)
def test_saved_bytes_is_what_the_forward_keeps(shape, G):
    x = randn(shape, torch.bfloat16, DEV, seed=1)
    z = randn(shape, torch.bfloat16, DEV, seed=2)
    w = randn(shape[-1:], torch.float32, DEV, seed=3)
    _, saved = rmsnorm_silu_gate_nondet_fwd(x, z, w, group_size=G)
    want = owned_nbytes(saved.tensors(), exclude=[x, z, w])
    assert saved_bytes_nondet(x, z, w, group_size=G) == want
    assert saved_bytes_nondet(x.to("meta"), z.to("meta"), w.to("meta"), group_size=G) == want


def _ok(**kw):
    x, z, w = (randn(s, torch.float32, DEV, seed=i) for i, s in
               enumerate([(4, 16), (4, 16), (16,)]))
    return {"x": x, "z": z, "weight": w, **kw}


def test_is_supported_true_on_a_valid_call():
    plan = make_nondet_plan(16, torch.float32, DEV, group_size=4)
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        s = is_supported_nondet(**_ok(group_size=4, plan=plan, activation="sigmoid",
                                      workspace=RMSNormSiluGateNondetWorkspace.for_plan(
                                          plan, DEV)))
    assert s == (True, "")


def _bad_calls():
    for name, (kwargs, _) in CASES.items():
        yield name, kwargs
    det = make_plan(16, torch.float32, DEV)
    yield "det plan", _ok(plan=det)
    yield "det workspace", _ok(workspace=RMSNormSiluGateDetWorkspace.for_plan(det, DEV))


@pytest.mark.parametrize("name,kwargs", list(_bad_calls()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_is_supported_false_with_the_entrys_message(name, kwargs):
    keep = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            rmsnorm_silu_gate_nondet(**kwargs)
        s = is_supported_nondet(**kwargs)
        with pytest.raises(ValueError) as err2:
            saved_bytes_nondet(**kwargs)
    assert s == (False, str(err.value)) and str(err2.value) == str(err.value)
    assert all(bitwise_equal(v, kwargs[k]) for k, v in keep.items())
