"""is_supported / workspace_bytes / saved_bytes of the prepare agree with its checks and
with what for_plan and the prepare allocate."""

import dataclasses

import cake_mhc_det_train.api as api
import pytest
import torch
from _mhc_cases import DEV, make
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches
from cake_mhc_det_train import (
    MHCDetWorkspace,
    is_supported,
    make_plan,
    mhc_det_prepare,
    saved_bytes,
    workspace_bytes,
)
from test_mhc_bad_inputs import PREPARE

LAUNCHES = ("_launch_prepare_fwd", "_launch_prepare_bwd", "_launch_finish_fwd",
            "_launch_finish_bwd")
ARGS = ("X", "phi", "alpha", "bias")


@pytest.mark.parametrize("n,C", [(2, 1), (4, 16), (8, 33), (4, 4096), (8, 7168)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slices", [None, 1, 3])
def test_workspace_bytes_matches_for_plan(n, C, dtype, slices):
    plan = make_plan(n, C, dtype, DEV)
    if slices is not None:
        plan = dataclasses.replace(plan, dphi_slices=slices)
    assert workspace_bytes(plan) == workspace_bytes(plan, DEV) == \
        MHCDetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_refuses_as_for_plan():
    with pytest.raises(ValueError) as e:
        MHCDetWorkspace.for_plan(None, DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes(None)
    assert str(e.value) == str(e2.value)
    with pytest.raises(ValueError, match="device"):
        workspace_bytes(make_plan(4, 16, torch.float32, DEV), device="nowhere")


def _x_layouts(c):
    X = c["X"]
    yield X
    if X.dim() == 4:
        yield X.transpose(0, 1)                          # [S, B, n, C]: no flattening view
    yield torch.cat([X, X], -2)[..., ::2, :]             # strided streams: still a view


@pytest.mark.parametrize("lead,n,C,dtype", [((6,), 4, 16, torch.float32),
                                            ((2, 3), 2, 8, torch.bfloat16),
                                            ((0,), 4, 16, torch.float32),
                                            ((3, 2), 8, 5, torch.float32)])
def test_saved_bytes_matches_prepare(lead, n, C, dtype):
    c = make(None, n, C, dtype, lead=lead)
    for X in _x_layouts(c):
        kw = {**{k: c[k] for k in ARGS[1:]}, "X": X}
        _, handle = mhc_det_prepare(**kw)
        want = owned_nbytes(handle.tensors(), exclude=list(kw.values()))
        assert saved_bytes(**kw) == want
        meta = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                for k, v in kw.items()}
        assert saved_bytes(**meta) == want


def test_is_supported_true_and_launches_nothing():
    c = make(6, 4, 16, torch.float32)
    kw = {k: c[k] for k in ARGS}
    plan = make_plan(4, 16, torch.float32, DEV)
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(**kw, plan=plan, workspace=MHCDetWorkspace.for_plan(plan, DEV))
    assert s and s.reason == ""


@pytest.mark.parametrize("case", list(PREPARE))
def test_is_supported_false_with_the_entrys_message(case):
    kw = PREPARE[case][0]()
    keep = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)
            and v.device.type != "meta"}
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(**kw)
        with pytest.raises(ValueError) as e:
            mhc_det_prepare(**kw)
    assert not s and s.reason == str(e.value)
    if not any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in kw.values()):
        with pytest.raises(ValueError) as e2:
            saved_bytes(**kw)
        assert str(e2.value) == s.reason
    assert all(bitwise_equal(v, kw[k]) for k, v in keep.items())


def test_saved_bytes_counts_the_copy_of_an_unflattenable_x():
    c = make(None, 4, 16, torch.float32, lead=(2, 3))
    rest = [c[k] for k in ARGS[1:]]
    Xt = c["X"].transpose(0, 1)
    assert saved_bytes(Xt, *rest) - saved_bytes(c["X"], *rest) == Xt.numel() * 4
