"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses
from typing import ClassVar

import pytest
import torch
from cake_core import Mode, Plan, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetPlan,
    RMSNormSiluGateDetSavedSet,
    RMSNormSiluGateDetWorkspace,
    make_plan,
    rmsnorm_silu_gate_det,
    rmsnorm_silu_gate_det_bwd,
    rmsnorm_silu_gate_det_fwd,
)

DEV = default_device()


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set (same tensor names)."""

    tensor_names = ("x", "z", "weight", "rstd")


class RMSNormSiluGateNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


@dataclasses.dataclass(frozen=True)
class OtherFamilyPlan(Plan):
    """Another family's plan with the same field names."""

    family: ClassVar[str] = "other"
    hidden_size: int = 32
    group_size: int = 32


def _inputs(D=32):
    x = randn((6, D), torch.float32, DEV, seed=1)
    z = randn((6, D), torch.float32, DEV, seed=2)
    w = randn((D,), torch.float32, DEV, seed=3)
    return x, z, w


def _fwd(D=32):
    return rmsnorm_silu_gate_det_fwd(*_inputs(D))


def test_foreign_saved_sets_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    tensors = dict(zip(saved.tensor_names, saved.tensors(), strict=True))
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        rmsnorm_silu_gate_det_bwd(dy, OtherFamilySavedSet(Mode.DET, tensors))
    nondet = RMSNormSiluGateDetSavedSet(Mode.NONDET, tensors, saved.meta)
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_silu_gate_det_bwd(dy, nondet)
    with pytest.raises(ValueError, match="saved: got tuple"):
        rmsnorm_silu_gate_det_bwd(dy, saved.tensors())


def test_foreign_workspaces_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    plan = saved.plan
    nondet_plan = dataclasses.replace(plan)  # same fields...
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)  # ...but another mode
    buf = {"partials": torch.zeros(plan.bwd_programs, 32, device=DEV)}
    ws_nondet = RMSNormSiluGateDetWorkspace(nondet_plan, DEV, buf)
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws_nondet)
    ws_other = RMSNormSiluGateNondetWorkspace(plan, DEV, buf)
    with pytest.raises(ValueError, match="workspace: got RMSNormSiluGateNondetWorkspace"):
        rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws_other)
    ws_wrong_plan = RMSNormSiluGateDetWorkspace.for_plan(make_plan(64, torch.float32, DEV), DEV)
    with pytest.raises(ValueError, match="was made for plan"):
        rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws_wrong_plan)
    ws_bad_buffer = RMSNormSiluGateDetWorkspace(plan, DEV,
                                                {"partials": torch.zeros(1, 1, device=DEV)})
    with pytest.raises(ValueError, match="'partials' must be a contiguous fp32 tensor"):
        rmsnorm_silu_gate_det_bwd(dy, saved, workspace=ws_bad_buffer)
    with pytest.raises(ValueError, match="was made for plan"):
        rmsnorm_silu_gate_det(*_inputs(), workspace=ws_wrong_plan)
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_silu_gate_det(*_inputs(), workspace=ws_nondet)
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        rmsnorm_silu_gate_det(*_inputs(), workspace=torch.zeros(4, 32))


def test_foreign_plans_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    with pytest.raises(ValueError, match="plan: made for hidden_size=64"):
        rmsnorm_silu_gate_det_bwd(dy, saved, plan=make_plan(64, torch.float32, DEV))
    with pytest.raises(ValueError, match="group_size=16"):
        rmsnorm_silu_gate_det_bwd(dy, saved, plan=make_plan(32, torch.float32, DEV,
                                                            group_size=16))
    with pytest.raises(ValueError, match="plan: got OtherFamilyPlan"):
        rmsnorm_silu_gate_det(*_inputs(), plan=OtherFamilyPlan())
    with pytest.raises(ValueError, match="plan: got dict"):
        rmsnorm_silu_gate_det(*_inputs(), plan=saved.plan.to_dict())
    nondet = dataclasses.replace(saved.plan)
    object.__setattr__(nondet, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="mode=nondet"):
        rmsnorm_silu_gate_det(*_inputs(), plan=nondet)
    with pytest.raises(ValueError, match="mode must be det"):
        RMSNormSiluGateDetPlan.from_dict({**saved.plan.to_dict(), "mode": "nondet"})
    with pytest.raises(ValueError, match="plan: expected RMSNormSiluGateDetPlan"):
        RMSNormSiluGateDetWorkspace.for_plan(OtherFamilyPlan(), DEV)


def test_saved_set_format_carries_the_gate():
    """Format 2: the saved set's meta holds the forward's canonical gate, which the
    backward uses ("swish" is saved as "silu")."""
    x, z, w = _inputs()
    assert RMSNormSiluGateDetSavedSet.format_version == 2
    for given, kept in (("swish", "silu"), ("silu", "silu"), ("sigmoid", "sigmoid")):
        _, saved = rmsnorm_silu_gate_det_fwd(x, z, w, activation=given)
        assert saved.version == 2 and saved.mode == Mode.DET
        assert saved.activation == kept
    # the plan does not carry the gate: one plan (and workspace) serves both
    _, silu = rmsnorm_silu_gate_det_fwd(x, z, w)
    _, sig = rmsnorm_silu_gate_det_fwd(x, z, w, activation="sigmoid")
    assert silu.plan == sig.plan and "activation" not in silu.plan.to_dict()
