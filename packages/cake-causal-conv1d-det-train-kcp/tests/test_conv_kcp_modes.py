"""Mode and type checks: the KCP entries take only this package's det saved set and
workspace (not the single-rank package's, not a non-det type), and refuse them before any
launch or collective."""

import dataclasses
from typing import ClassVar

import cake_causal_conv1d_det_train_kcp.api as kcp_api
import pytest
import torch
from _conv_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPSavedSet,
    CausalConv1dDetKCPWorkspace,
    build_context_det_kcp,
    causal_conv1d_det_bwd_kcp,
    causal_conv1d_det_fwd_kcp,
    causal_conv1d_det_kcp,
    partition_det_kcp,
)
from cake_core import Mode, Plan, SavedSet, Workspace


class NonDetConvKCPSavedSet(SavedSet):
    """What a non-deterministic KCP sibling would hand over (same tensors, nondet)."""

    tensor_names = CausalConv1dDetKCPSavedSet.tensor_names


class NonDetConvKCPWorkspace(Workspace):
    """A non-deterministic sibling's workspace."""


@dataclasses.dataclass(frozen=True)
class OtherPlan(Plan):
    family: ClassVar[str] = "cake-other-det-train"
    block: int = 16


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    local = shard(global_inputs(60, 8, 4, seed=21), p)
    _, saved = causal_conv1d_det_fwd_kcp(*local[:3], ctx)
    return ctx, local, saved


@pytest.fixture
def no_work(monkeypatch):
    """Any launch or collective fails the test."""
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in ("causal_conv1d_det_fwd", "causal_conv1d_det_bwd", "all_gather_bytes",
                 "device_halo"):
        monkeypatch.setattr(kcp_api, name, boom)


def _own(saved):
    return dict(zip(saved.tensor_names, saved.tensors()[:3], strict=True))


def test_backward_refuses_foreign_saved_sets(setup, no_work):
    ctx, local, saved = setup
    dy = local[3]
    nondet_same_type = CausalConv1dDetKCPSavedSet(Mode.NONDET, _own(saved), saved.meta,
                                                  saved.local)
    foreign = {
        "CausalConv1dDetSavedSet (the single-rank package's)": saved.local,
        "NonDetConvKCPSavedSet": NonDetConvKCPSavedSet(Mode.NONDET, _own(saved)),
        "CausalConv1dDetKCPSavedSet with mode=nondet": nondet_same_type,
        "dict": _own(saved),
        "None": None,
    }
    for label, obj in foreign.items():
        with pytest.raises(ValueError, match=r"^saved: got .*expected CausalConv1dDetKCPSavedSet "
                                             r"with mode=det"):
            causal_conv1d_det_bwd_kcp(dy, obj, ctx)
        assert label
    nested_nondet = saved.local.__class__(Mode.NONDET, dict(zip(
        saved.local.tensor_names, saved.local.tensors(), strict=True)), saved.local.meta)
    bad = CausalConv1dDetKCPSavedSet(Mode.DET, _own(saved), saved.meta, nested_nondet)
    with pytest.raises(ValueError, match="^saved.local: got CausalConv1dDetSavedSet with "
                                         "mode=nondet"):
        causal_conv1d_det_bwd_kcp(dy, bad, ctx)


def test_entries_refuse_foreign_workspaces(setup, no_work):
    from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace, make_plan

    ctx, local, saved = setup
    plan = make_plan(8, 4, torch.float32, DEV)
    det_local = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=60, max_seqs=9)
    nondet = NonDetConvKCPWorkspace(plan, DEV, {})
    nondet.mode = Mode.NONDET
    own_nondet = CausalConv1dDetKCPWorkspace.for_context(plan, ctx)
    own_nondet.mode = Mode.NONDET
    for obj, match in ((det_local, "got CausalConv1dDetWorkspace"),
                       (nondet, "got NonDetConvKCPWorkspace"),
                       (own_nondet, "got CausalConv1dDetKCPWorkspace with mode=nondet"),
                       ({}, "got dict")):
        for call in (lambda o: causal_conv1d_det_bwd_kcp(local[3], saved, ctx, workspace=o),
                     lambda o: causal_conv1d_det_fwd_kcp(*local[:3], ctx, workspace=o),
                     lambda o: causal_conv1d_det_kcp(*local[:3], ctx, workspace=o)):
            with pytest.raises(ValueError, match=f"^workspace: {match}"):
                call(obj)


def test_workspace_of_another_context_plan_or_dtype(setup, no_work):
    from cake_causal_conv1d_det_train import make_plan

    ctx, local, saved = setup
    plan = make_plan(8, 4, torch.float32, DEV)
    other_p = build_context_det_kcp(partition_det_kcp([0, 60], 1), None, 0, DEV, 4)
    for ws, match in ((CausalConv1dDetKCPWorkspace.for_context(plan, other_p), "made for"),
                      (CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=torch.bfloat16),
                       "made for"),
                      (CausalConv1dDetKCPWorkspace.for_context(
                          dataclasses.replace(plan, block_t_bwd=16), ctx), "was made for plan")):
        with pytest.raises(ValueError, match=f"^workspace: .*{match}"):
            causal_conv1d_det_bwd_kcp(local[3], saved, ctx, workspace=ws)
        with pytest.raises(ValueError, match=f"^workspace: .*{match}"):
            causal_conv1d_det_fwd_kcp(*local[:3], ctx, workspace=ws)


def test_plans_of_another_type_mode_or_shape(setup, no_work):
    from cake_causal_conv1d_det_train import make_plan

    ctx, local, saved = setup
    for call in (lambda pl: causal_conv1d_det_bwd_kcp(local[3], saved, ctx, plan=pl),
                 lambda pl: causal_conv1d_det_fwd_kcp(*local[:3], ctx, plan=pl),
                 lambda pl: causal_conv1d_det_kcp(*local[:3], ctx, plan=pl)):
        with pytest.raises(ValueError, match="^plan: got OtherPlan"):
            call(OtherPlan())
        with pytest.raises(ValueError, match="^plan: got dict"):
            call(make_plan(8, 4, torch.float32, DEV).to_dict())
        with pytest.raises(ValueError, match="^plan: made for hidden_size=16, kernel_size=4"):
            call(make_plan(16, 4, torch.float32, DEV))


def test_saved_set_of_another_context(setup, no_work):
    ctx, local, saved = setup
    for other in (build_context_det_kcp(partition_det_kcp([0, 60], 1), None, 0, DEV, 4),
                  build_context_det_kcp(ctx.partition, None, 0, DEV, 3)):
        with pytest.raises(ValueError, match=r"^saved: made on \(partition, rank, kernel size\)"):
            causal_conv1d_det_bwd_kcp(local[3], saved, other)
