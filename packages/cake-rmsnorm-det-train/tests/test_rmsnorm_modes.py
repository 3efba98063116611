"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses

import pytest
import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import (
    RMSNormDetSavedSet,
    RMSNormDetWorkspace,
    make_plan,
    rmsnorm_det,
    rmsnorm_det_bwd,
    rmsnorm_det_fwd,
)

DEV = default_device()


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set."""

    tensor_names = ("xh", "weight", "rstd")


class RMSNormNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


def _fwd(H=32):
    x = randn((6, H), torch.float32, DEV, seed=1)
    w = randn((H,), torch.float32, DEV, seed=2)
    y, saved = rmsnorm_det_fwd(x, w)
    return y, saved


def test_foreign_saved_sets_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    other = OtherFamilySavedSet(Mode.DET, dict(zip(saved.tensor_names, saved.tensors(),
                                                   strict=True)))
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        rmsnorm_det_bwd(dy, None, other)
    nondet = RMSNormDetSavedSet(Mode.NONDET, dict(zip(saved.tensor_names, saved.tensors(),
                                                      strict=True)), saved.meta)
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_det_bwd(dy, None, nondet)


def test_foreign_workspaces_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    plan = saved.plan
    nondet_plan = dataclasses.replace(plan)  # same fields...
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)  # ...but another mode
    ws_nondet = RMSNormDetWorkspace(nondet_plan, DEV, {"partials": torch.zeros(1, 1, device=DEV)})
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_det_bwd(dy, None, saved, workspace=ws_nondet)
    ws_other = RMSNormNondetWorkspace(plan, DEV, {"partials": torch.zeros(1, 1, device=DEV)})
    with pytest.raises(ValueError, match="workspace: got RMSNormNondetWorkspace"):
        rmsnorm_det_bwd(dy, None, saved, workspace=ws_other)
    ws_wrong_plan = RMSNormDetWorkspace.for_plan(make_plan(64, torch.float32, DEV), DEV)
    with pytest.raises(ValueError, match="was made for plan"):
        rmsnorm_det_bwd(dy, None, saved, workspace=ws_wrong_plan)
    ws_bad_buffer = RMSNormDetWorkspace(plan, DEV, {"partials": torch.zeros(1, 1, device=DEV)})
    with pytest.raises(ValueError, match="'partials' must be a contiguous fp32 tensor"):
        rmsnorm_det_bwd(dy, None, saved, workspace=ws_bad_buffer)
    x = randn((6, 32), torch.float32, DEV, seed=1).requires_grad_()
    w = randn((32,), torch.float32, DEV, seed=2)
    with pytest.raises(ValueError, match="was made for plan"):
        rmsnorm_det(x, w, workspace=ws_wrong_plan)


def test_foreign_plan_refused():
    y, saved = _fwd()
    with pytest.raises(ValueError, match="plan: made for hidden_size=64"):
        rmsnorm_det_bwd(torch.ones_like(y), None, saved, plan=make_plan(64, torch.float32, DEV))
    with pytest.raises(ValueError, match="plan: got dict"):
        rmsnorm_det(randn((2, 32), torch.float32, DEV), randn((32,), torch.float32, DEV),
                    plan=saved.plan.to_dict())


def test_tensor_as_workspace_message_is_clean():
    x = randn((6, 32), torch.float32, DEV, seed=1)
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        rmsnorm_det(x, torch.ones(32, device=DEV), workspace=torch.zeros(4, 32))
