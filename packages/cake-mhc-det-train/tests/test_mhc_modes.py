"""The det entry points refuse another mode's or family's handle, workspace or plan."""

import dataclasses

import pytest
import torch
from _mhc_cases import DEV, make
from cake_core import Mode, SavedSet, Workspace
from cake_mhc_det_train import (
    MHCDetPlan,
    MHCDetSavedSet,
    MHCDetWorkspace,
    make_plan,
    mhc_det_finish,
    mhc_det_prepare,
)


class OtherFamilySavedSet(SavedSet):
    tensor_names = ("coef", "mix", "rstd", "x_view")


class MHCNondetWorkspace(Workspace):
    """A non-det sibling's workspace (no such family ships)."""


def _prep(case):
    return mhc_det_prepare(case["X"], case["phi"], case["alpha"], case["bias"])


def test_foreign_or_nondet_handles_refused():
    case = make(5, 4, 16, torch.float32)
    U, h = _prep(case)
    other = OtherFamilySavedSet(Mode.DET, dict(zip(h.tensor_names, h.tensors(), strict=True)),
                                h.meta)
    with pytest.raises(ValueError, match="handle: got OtherFamilySavedSet"):
        mhc_det_finish(case["X"], U, other)
    nondet = MHCDetSavedSet(Mode.NONDET, dict(zip(h.tensor_names, h.tensors(), strict=True)),
                            h.meta)
    with pytest.raises(ValueError, match="mode=nondet"):
        mhc_det_finish(case["X"], U, nondet)
    with pytest.raises(ValueError, match="handle: got tuple"):
        mhc_det_finish(case["X"], U, h.tensors())


def test_plans_modes_and_fields():
    plan = make_plan(4, 16, torch.float32, DEV)
    with pytest.raises(ValueError, match="mode must be det"):
        dataclasses.replace(plan, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="n_streams must be one of"):
        dataclasses.replace(plan, n_streams=3)
    with pytest.raises(ValueError, match="block_m must be"):
        dataclasses.replace(plan, block_m=16)
    with pytest.raises(ValueError, match="dx_block_t must be a power of two >= 16"):
        dataclasses.replace(plan, dx_block_t=8)
    assert MHCDetPlan.from_dict(plan.to_dict()) == plan
    assert hash(plan) == hash(make_plan(4, 16, torch.float32, DEV))
    case = make(5, 4, 16, torch.float32)
    nondet = dataclasses.replace(plan)
    object.__setattr__(nondet, "mode", Mode.NONDET)
    with pytest.raises(ValueError, match="plan: .*mode=nondet"):
        mhc_det_prepare(case["X"], case["phi"], case["alpha"], case["bias"], plan=nondet)
    with pytest.raises(ValueError, match="plan: made for n_streams=4, hidden_size=32"):
        mhc_det_prepare(case["X"], case["phi"], case["alpha"], case["bias"],
                        plan=make_plan(4, 32, torch.float32, DEV))
    with pytest.raises(ValueError, match="n_streams"):
        make_plan(3, 16, torch.float32, DEV)


def test_foreign_workspaces_refused():
    case = make(5, 4, 16, torch.float32)
    args = (case["X"], case["phi"], case["alpha"], case["bias"])
    plan = make_plan(4, 16, torch.float32, DEV)
    nondet_plan = dataclasses.replace(plan)
    object.__setattr__(nondet_plan, "mode", Mode.NONDET)
    buf = {"dphi_partials": torch.zeros(1, 1, device=DEV)}
    with pytest.raises(ValueError, match="mode=nondet"):
        mhc_det_prepare(*args, workspace=MHCDetWorkspace(nondet_plan, DEV, buf))
    with pytest.raises(ValueError, match="workspace: got MHCNondetWorkspace"):
        mhc_det_prepare(*args, workspace=MHCNondetWorkspace(plan, DEV, buf))
    other = MHCDetWorkspace.for_plan(make_plan(4, 32, torch.float32, DEV), DEV)
    with pytest.raises(ValueError, match="was made for plan"):
        mhc_det_prepare(*args, workspace=other)
    with pytest.raises(ValueError, match="'dphi_partials' must be a contiguous fp32 tensor"):
        mhc_det_prepare(*args, workspace=MHCDetWorkspace(plan, DEV, buf))
    with pytest.raises(ValueError, match="plan: expected MHCDetPlan"):
        MHCDetWorkspace.for_plan(object(), DEV)
    # the right workspace works, and is reusable
    ws = MHCDetWorkspace.for_plan(plan, DEV)
    for _ in range(2):
        X = case["X"].clone().requires_grad_()
        U, h = mhc_det_prepare(X, case["phi"], case["alpha"], case["bias"], workspace=ws)
        mhc_det_finish(X, U, h).sum().backward()
        assert torch.isfinite(X.grad).all()


def test_workspace_changed_before_backward_refused():
    """Fresh-user review: a workspace whose mode (or plan, or device) was changed between
    the prepare and the backward went unnoticed. Both backwards check it again, before any
    launch: the caller's tensors, gradients and the workspace buffer stay untouched."""
    case = make(5, 4, 16, torch.float32)
    plan = make_plan(4, 16, torch.float32, DEV)
    other_key = make_plan(4, 32, torch.float32, DEV).key
    changes = (("mode", Mode.NONDET,
                "workspace: got MHCDetWorkspace with mode=nondet, expected MHCDetWorkspace "
                "with mode=det"),
               ("plan_key", other_key, "workspace: MHCDetWorkspace was made for plan"),
               ("device", torch.device("meta"), "workspace: buffers are on meta"))
    for attr, value, msg in changes:
        for with_finish in (True, False):
            ws = MHCDetWorkspace.for_plan(plan, DEV)
            ws["dphi_partials"].fill_(7.0)
            X = case["X"].clone().requires_grad_()
            phi = case["phi"].clone().requires_grad_()
            W = case["W"].clone().requires_grad_()
            U, h = mhc_det_prepare(X, phi, case["alpha"], case["bias"], plan=plan,
                                   workspace=ws)
            out = mhc_det_finish(X, torch.tanh(U @ W), h) if with_finish else U
            setattr(ws, attr, value)
            with pytest.raises(ValueError, match=msg) as e:
                out.sum().backward()
            assert "checked again in the backward" in str(e.value)
            assert X.grad is None and phi.grad is None and W.grad is None
            assert bool((ws["dphi_partials"] == 7.0).all())
    # restored, the same workspace serves a forward and backward again
    ws = MHCDetWorkspace.for_plan(plan, DEV)
    ws.mode = Mode.NONDET
    ws.mode = Mode.DET
    X = case["X"].clone().requires_grad_()
    U, h = mhc_det_prepare(X, case["phi"], case["alpha"], case["bias"], plan=plan,
                           workspace=ws)
    mhc_det_finish(X, U, h).sum().backward()
    assert torch.isfinite(X.grad).all()
