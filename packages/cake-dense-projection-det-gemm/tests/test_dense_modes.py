"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses

import pytest
import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    DenseProjectionDetSavedSet,
    DenseProjectionDetWorkspace,
    dense_projection_det,
    dense_projection_det_bwd,
    dense_projection_det_fwd,
    make_plan,
)

DEV = default_device()


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set."""

    tensor_names = ("x", "weight")


class DenseProjectionNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


def _fwd(M=600, N=12, K=20):
    """A forward whose plan splits the wgrad (the workspace then has partial planes; the
    CUDA rule splits only beyond 4096 tokens, so the split is set here)."""
    x = randn((M, K), torch.float32, DEV, seed=1)
    w = randn((N, K), torch.float32, DEV, seed=2)
    plan = dataclasses.replace(make_plan(M, N, K, torch.float32, DEV), wgrad_splits=3)
    return dense_projection_det_fwd(x, w, plan=plan)


def test_foreign_saved_sets_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    tensors = dict(zip(saved.tensor_names, saved.tensors(), strict=True))
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        dense_projection_det_bwd(dy, OtherFamilySavedSet(Mode.DET, tensors))
    nondet = DenseProjectionDetSavedSet(Mode.NONDET, tensors, saved.meta)
    with pytest.raises(ValueError, match="mode=nondet"):
        dense_projection_det_bwd(dy, nondet)
    with pytest.raises(ValueError, match="saved: got dict"):
        dense_projection_det_bwd(dy, tensors)


def test_foreign_workspaces_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    plan = saved.plan
    assert plan.wgrad_splits > 1
    good = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    bufs = {n: good[n] for n in good.names}
    nondet_plan = dataclasses.replace(plan)
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="mode=nondet"):
        dense_projection_det_bwd(dy, saved, workspace=DenseProjectionDetWorkspace(
            nondet_plan, DEV, bufs))
    with pytest.raises(ValueError, match="workspace: got DenseProjectionNondetWorkspace"):
        dense_projection_det_bwd(dy, saved,
                                 workspace=DenseProjectionNondetWorkspace(plan, DEV, bufs))
    other = DenseProjectionDetWorkspace.for_plan(
        dataclasses.replace(plan, wgrad_splits=plan.wgrad_splits + 1), DEV)
    with pytest.raises(ValueError, match="was made for plan"):
        dense_projection_det_bwd(dy, saved, workspace=other)
    bad = DenseProjectionDetWorkspace(plan, DEV, {"partials": torch.zeros(1, 1, device=DEV),
                                                  "bias_partials": good["bias_partials"]})
    with pytest.raises(ValueError, match="'partials' must be a contiguous fp32 tensor"):
        dense_projection_det_bwd(dy, saved, workspace=bad)
    half = DenseProjectionDetWorkspace(plan, DEV, {"partials": good["partials"].half(),
                                                   "bias_partials": good["bias_partials"]})
    with pytest.raises(ValueError, match="'partials' must be a contiguous fp32"):
        dense_projection_det_bwd(dy, saved, workspace=half)
    missing = DenseProjectionDetWorkspace(plan, DEV, {"partials": good["partials"]})
    with pytest.raises(ValueError, match="'bias_partials' .* got missing"):
        dense_projection_det_bwd(dy, saved, workspace=missing)
    x = randn((6, 20), torch.float32, DEV, seed=1).requires_grad_()
    with pytest.raises(ValueError, match="was made for plan"):
        dense_projection_det(x, randn((12, 20), torch.float32, DEV), workspace=other)


def test_foreign_plan_refused():
    y, saved = _fwd()
    with pytest.raises(ValueError, match="plan: made for out_features=13"):
        dense_projection_det_bwd(torch.ones_like(y), saved,
                                 plan=make_plan(600, 13, 20, torch.float32, DEV))
    with pytest.raises(ValueError, match="plan: got dict"):
        dense_projection_det(randn((2, 20), torch.float32, DEV),
                             randn((12, 20), torch.float32, DEV), plan=saved.plan.to_dict())
    nondet = dataclasses.replace(saved.plan)
    object.__setattr__(nondet, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="plan: got DenseProjectionDetPlan with mode=nondet"):
        dense_projection_det_bwd(torch.ones_like(y), saved, plan=nondet)


def test_tensor_as_workspace_message_is_clean():
    x = randn((6, 20), torch.float32, DEV, seed=1)
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        dense_projection_det(x, torch.ones(3, 20, device=DEV), workspace=torch.zeros(4, 32))
