"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses

import pytest
import torch
from _moe_cases import DEV, make
from cake_core import Mode, SavedSet, Workspace
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetSavedSet,
    MoEGroupedDetWorkspace,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set."""

    tensor_names = ("x", "weight", "ends")


class MoEGroupedNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


def _fwd():
    x, w, offs, dy = make([5, 0, 9])
    plan = dataclasses.replace(make_plan(14, 3, 20, 24, torch.float32, DEV), wgrad_splits=3)
    y, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    return x, w, offs, dy, saved


def test_foreign_saved_sets_refused():
    *_, dy, saved = _fwd()
    tensors = dict(zip(saved.tensor_names, saved.tensors(), strict=True))
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        moe_grouped_det_gemm_bwd(dy, OtherFamilySavedSet(Mode.DET, tensors))
    with pytest.raises(ValueError, match="mode=nondet"):
        moe_grouped_det_gemm_bwd(dy, MoEGroupedDetSavedSet(Mode.NONDET, tensors, saved.meta))
    with pytest.raises(ValueError, match="saved: got dict"):
        moe_grouped_det_gemm_bwd(dy, tensors)


def test_foreign_workspaces_refused():
    x, w, offs, dy, saved = _fwd()
    plan = saved.plan
    good = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    bufs = {n: good[n] for n in good.names}
    nondet_plan = dataclasses.replace(plan)
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="mode=nondet"):
        moe_grouped_det_gemm_bwd(dy, saved, workspace=MoEGroupedDetWorkspace(
            nondet_plan, DEV, bufs))
    with pytest.raises(ValueError, match="workspace: got MoEGroupedNondetWorkspace"):
        moe_grouped_det_gemm_bwd(dy, saved, workspace=MoEGroupedNondetWorkspace(plan, DEV,
                                                                                bufs))
    other = MoEGroupedDetWorkspace.for_plan(dataclasses.replace(plan, wgrad_splits=2), DEV)
    with pytest.raises(ValueError, match="was made for plan"):
        moe_grouped_det_gemm_bwd(dy, saved, workspace=other)
    with pytest.raises(ValueError, match="was made for plan"):
        moe_grouped_det_gemm(x, w, offs, plan=plan, workspace=other)
    half = MoEGroupedDetWorkspace(plan, DEV, {"partials": good["partials"].half()})
    with pytest.raises(ValueError, match="'partials' must be a contiguous fp32"):
        moe_grouped_det_gemm_bwd(dy, saved, workspace=half)
    with pytest.raises(ValueError, match="'partials' .* got missing"):
        moe_grouped_det_gemm_bwd(dy, saved, workspace=MoEGroupedDetWorkspace(plan, DEV, {}))
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        moe_grouped_det_gemm(x, w, offs, workspace=torch.zeros(4))


def test_foreign_plan_refused():
    x, w, offs, dy, saved = _fwd()
    with pytest.raises(ValueError, match="plan: made for num_experts=4"):
        moe_grouped_det_gemm_bwd(dy, saved, plan=make_plan(14, 4, 20, 24, torch.float32, DEV))
    with pytest.raises(ValueError, match="plan: got dict"):
        moe_grouped_det_gemm(x, w, offs, plan=saved.plan.to_dict())
    nondet = dataclasses.replace(saved.plan)
    object.__setattr__(nondet, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="plan: got MoEGroupedDetPlan with mode=nondet"):
        moe_grouped_det_gemm_bwd(dy, saved, plan=nondet)
    with pytest.raises(ValueError, match="mode"):
        dataclasses.replace(saved.plan, mode=Mode.NONDET)
