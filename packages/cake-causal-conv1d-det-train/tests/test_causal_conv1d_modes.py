"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses

import pytest
import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetSavedSet,
    CausalConv1dDetWorkspace,
    causal_conv1d_det,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
    make_plan,
)
from cake_core import Mode, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()
D, W = 12, 4


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set (same tensor names)."""

    tensor_names = ("x", "weight", "bias", "initial_state", "cu_seqlens")


class CausalConv1dNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


def _fwd():
    x = randn((2, 9, D), torch.float32, DEV, seed=1)
    w = randn((D, W), torch.float32, DEV, seed=2)
    y, _, saved = causal_conv1d_det_fwd(x, w, activation="silu")
    return y, saved


def _tensors(saved):
    return dict(zip(saved.tensor_names, saved.tensors(), strict=True))


def test_foreign_saved_sets_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        causal_conv1d_det_bwd(dy, None, OtherFamilySavedSet(Mode.DET, _tensors(saved)))
    nondet = CausalConv1dDetSavedSet(Mode.NONDET, _tensors(saved), saved.meta)
    with pytest.raises(ValueError, match="mode=nondet"):
        causal_conv1d_det_bwd(dy, None, nondet)
    with pytest.raises(ValueError, match=r"saved: got dict \(mode=none\)"):
        causal_conv1d_det_bwd(dy, None, _tensors(saved))


def test_foreign_workspaces_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    plan = saved.plan
    nondet_plan = dataclasses.replace(plan)  # same fields...
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)  # ...but another mode
    good = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=18, max_seqs=2)
    bufs = {n: good[n] for n in good.names}
    with pytest.raises(ValueError, match="mode=nondet"):
        causal_conv1d_det_bwd(dy, None, saved,
                              workspace=CausalConv1dDetWorkspace(nondet_plan, DEV, bufs))
    with pytest.raises(ValueError, match="workspace: got CausalConv1dNondetWorkspace"):
        causal_conv1d_det_bwd(dy, None, saved,
                              workspace=CausalConv1dNondetWorkspace(plan, DEV, bufs))
    other = CausalConv1dDetWorkspace.for_plan(make_plan(D, 3, torch.float32, DEV), DEV,
                                              max_tokens=18, max_seqs=2)
    with pytest.raises(ValueError, match="was made for plan"):
        causal_conv1d_det_bwd(dy, None, saved, workspace=other)
    bad = CausalConv1dDetWorkspace(plan, DEV, {
        "dweight_partials": torch.zeros(4, D, W + 1, device=DEV),
        "dbias_partials": torch.zeros(4, D, device=DEV)})
    with pytest.raises(ValueError, match="'dweight_partials' must be a contiguous fp32"):
        causal_conv1d_det_bwd(dy, None, saved, workspace=bad)
    small = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=1, max_seqs=1)
    with pytest.raises(ValueError, match="holds"):
        causal_conv1d_det_bwd(dy, None, saved, workspace=small)
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        causal_conv1d_det_bwd(dy, None, saved, workspace=torch.zeros(4))
    x = randn((2, 9, D), torch.float32, DEV, seed=1).requires_grad_()
    with pytest.raises(ValueError, match="was made for plan"):  # the entry checks it too
        causal_conv1d_det(x, saved.weight, workspace=other)
    with pytest.raises(ValueError, match="plan: expected CausalConv1dDetPlan"):
        CausalConv1dDetWorkspace.for_plan(plan.to_dict(), DEV, max_tokens=4)


def test_foreign_plans_refused():
    y, saved = _fwd()
    dy = torch.ones_like(y)
    with pytest.raises(ValueError, match="plan: made for hidden_size=12, kernel_size=3"):
        causal_conv1d_det_bwd(dy, None, saved, plan=make_plan(D, 3, torch.float32, DEV))
    with pytest.raises(ValueError, match="plan: got dict"):
        causal_conv1d_det(saved.x, saved.weight, plan=saved.plan.to_dict())
    nondet_plan = dataclasses.replace(saved.plan)
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="mode=nondet"):
        causal_conv1d_det_bwd(dy, None, saved, plan=nondet_plan)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(saved.plan, mode=Mode.NONDET)
