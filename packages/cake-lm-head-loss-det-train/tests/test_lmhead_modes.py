"""A det backward refuses another mode's or family's saved set, workspace or plan."""

import dataclasses

import pytest
import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import (
    LMHeadLossDetSavedSet,
    LMHeadLossDetWorkspace,
    lm_head_loss_det,
    lm_head_loss_det_bwd,
    lm_head_loss_det_fwd,
    make_plan,
)

DEV = default_device()


class OtherFamilySavedSet(SavedSet):
    """Stands in for another family's saved set."""

    tensor_names = LMHeadLossDetSavedSet.tensor_names


class LMHeadLossNondetWorkspace(Workspace):
    """A non-det sibling's workspace (defined here, no such family ships)."""


def _data(T=12, H=16, V=40):
    h = randn((T, H), torch.float32, DEV, seed=1)
    w = randn((V, H), torch.float32, DEV, seed=2, scale=0.3)
    y = torch.arange(T, device=DEV) % V
    return h, w, y


def _fwd(**kw):
    h, w, y = _data()
    (loss, _), saved = lm_head_loss_det_fwd(h, w, y, **kw)
    return loss, saved


def _as(cls, saved, mode=Mode.DET):
    return cls(mode, dict(zip(saved.tensor_names, saved.tensors(), strict=True)), saved.meta)


def test_foreign_saved_sets_refused():
    loss, saved = _fwd()
    one = torch.ones_like(loss)
    with pytest.raises(ValueError, match="saved: got OtherFamilySavedSet"):
        lm_head_loss_det_bwd(one, _as(OtherFamilySavedSet, saved))
    with pytest.raises(ValueError, match="mode=nondet"):
        lm_head_loss_det_bwd(one, _as(LMHeadLossDetSavedSet, saved, Mode.NONDET))
    with pytest.raises(ValueError, match=r"saved: got dict \(mode=none\)"):
        lm_head_loss_det_bwd(one, {"hidden": None})


def test_foreign_workspaces_refused():
    loss, saved = _fwd()
    one = torch.ones_like(loss)
    plan = saved.plan
    nondet_plan = dataclasses.replace(plan)
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)
    buf = {"logits": torch.zeros(plan.chunk_tokens, 40, device=DEV)}
    with pytest.raises(ValueError, match="mode=nondet"):
        lm_head_loss_det_bwd(one, saved, workspace=LMHeadLossDetWorkspace(nondet_plan, DEV, buf))
    with pytest.raises(ValueError, match="workspace: got LMHeadLossNondetWorkspace"):
        lm_head_loss_det_bwd(one, saved, workspace=LMHeadLossNondetWorkspace(plan, DEV, buf))
    other = dataclasses.replace(plan, chunk_tokens=plan.chunk_tokens + 1)
    with pytest.raises(ValueError, match="was made for plan"):
        lm_head_loss_det_bwd(one, saved,
                             workspace=LMHeadLossDetWorkspace.for_plan(other, DEV, torch.float32))
    bad = LMHeadLossDetWorkspace(plan, DEV, {"logits": torch.zeros(1, 1, device=DEV)})
    with pytest.raises(ValueError, match="'logits' must be a contiguous float32 tensor"):
        lm_head_loss_det_bwd(one, saved, workspace=bad)
    h, w, y = _data()
    bf_ws = LMHeadLossDetWorkspace.for_plan(make_plan(16, 40, torch.bfloat16, DEV), DEV,
                                            torch.float32)
    with pytest.raises(ValueError, match="'dlogits' must be a contiguous bfloat16"):
        lm_head_loss_det(h.bfloat16(), w.bfloat16(), y, workspace=bf_ws)
    with pytest.raises(ValueError, match=r"workspace: got Tensor \(mode=none\)"):
        lm_head_loss_det(h, w, y, workspace=torch.zeros(4))


def test_foreign_plans_refused():
    h, w, y = _data()
    with pytest.raises(ValueError, match=r"plan: got dict \(mode=none\)"):
        lm_head_loss_det(h, w, y, plan=make_plan(16, 40, torch.float32, DEV).to_dict())
    with pytest.raises(ValueError, match="plan: made for hidden_size=16, vocab_size=41"):
        lm_head_loss_det(h, w, y, plan=make_plan(16, 41, torch.float32, DEV))
    with pytest.raises(ValueError, match="grad_in_forward=1 needs reduction"):
        lm_head_loss_det(h, w, y, reduction="none",
                         plan=make_plan(16, 40, torch.float32, DEV, reduction="mean"))
    loss, saved = _fwd()  # gradients computed in the forward: only its plan may finish them
    assert saved.grad_in_forward
    other = dataclasses.replace(saved.plan, chunk_tokens=3)
    with pytest.raises(ValueError, match="the forward computed the gradients"):
        lm_head_loss_det_bwd(torch.ones_like(loss), saved, plan=other)
    loss, saved = _fwd(reduction="none", plan=make_plan(16, 40, torch.float32, DEV,
                                                        reduction="none"))
    g = lm_head_loss_det_bwd(torch.ones_like(loss), saved, plan=other)  # recompute: any plan
    assert g.dhidden.shape == (12, 16) and g.dbias is None
