"""Mode and type checks: the KCP entries take only this package's det saved set and
workspace (not the single-rank package's, not one of another mode) and det KDADetPlans, and
refuse anything else before any launch or collective. The refusal of cake-kda-nondet-train-kcp's
real saved sets, workspaces and plans is tested there (this package does not depend on it)."""

import dataclasses
from typing import ClassVar

import cake_kda_det_train_kcp.api as kcp_api
import pytest
import torch
from _kda_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core import Mode, Plan
from cake_kda_det_train_kcp import (
    KDADetKCPSavedSet,
    KDADetKCPWorkspace,
    build_context_det_kcp,
    chunk_kda_det_bwd_kcp,
    chunk_kda_det_fwd_kcp,
    chunk_kda_det_kcp,
    partition_det_kcp,
)

N_OWN = len(KDADetKCPSavedSet.tensor_names)


@dataclasses.dataclass(frozen=True)
class OtherPlan(Plan):
    family: ClassVar[str] = "cake-other-det-train"
    block: int = 16


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=21)
    local = shard(xs, p)
    _, saved = chunk_kda_det_fwd_kcp(*local[:5], ctx, **kw)
    return ctx, local, saved


@pytest.fixture
def no_work(monkeypatch):
    """Any launch or collective fails the test."""
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in ("chunk_kda_det_bwd", "chunk_kda_det_fwd", "forward_allgather", "forward_ring",
                 "backward_allgather", "backward_ring", "sum_over_ranks"):
        monkeypatch.setattr(kcp_api, name, boom)


def test_backward_refuses_foreign_saved_sets(setup, no_work):
    ctx, local, saved = setup
    own = dict(zip(saved.tensor_names, saved.tensors()[:N_OWN], strict=True))
    foreign = {
        "KDADetSavedSet": saved.local[0],                       # the single-rank package's
        "KDADetKCPSavedSet with mode=nondet": KDADetKCPSavedSet(Mode.NONDET, own, saved.meta,
                                                                saved.local),
        "dict": own,
        "None": None,
    }
    for label, obj in foreign.items():
        with pytest.raises(ValueError, match=r"^saved: got .*expected KDADetKCPSavedSet with "
                                             r"mode=det"):
            chunk_kda_det_bwd_kcp(local[5], obj, ctx)
        assert label


def test_entries_refuse_foreign_workspaces(setup, no_work):
    from cake_kda_det_train import KDADetWorkspace, make_plan

    ctx, local, saved = setup
    plan = make_plan(16, 16, torch.float32, DEV)
    det_local = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=1, max_tokens=34, max_seqs=5)
    own_nondet = KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    own_nondet.mode = Mode.NONDET
    for obj, match in ((det_local, "got KDADetWorkspace"),
                       (own_nondet, "got KDADetKCPWorkspace with mode=nondet")):
        for call in (lambda o: chunk_kda_det_bwd_kcp(local[5], saved, ctx, workspace=o),
                     lambda o: chunk_kda_det_fwd_kcp(*local[:5], ctx, workspace=o),
                     lambda o: chunk_kda_det_kcp(*local[:5], ctx, workspace=o)):
            with pytest.raises(ValueError, match=f"^workspace: {match}"):
                call(obj)


def test_workspace_of_another_context_plan_or_dtype(setup, no_work):
    from cake_kda_det_train import make_plan

    ctx, local, saved = setup
    plan = make_plan(16, 16, torch.float32, DEV)
    assert plan == saved.plan  # the cases below differ from the forward's in one thing
    # another plan: a gate block the rule did not choose (the rule picks 128 on CUDA,
    # 256 on the CPU, so a fixed value can be the plan itself)
    other_plan = dataclasses.replace(plan, gate_block_t=2 * plan.gate_block_t)
    assert other_plan != plan
    ctx_msg = r"made for \(partition"
    ring = build_context_det_kcp(ctx.partition, None, 0, DEV, exchange="ring")
    other_p = build_context_det_kcp(partition_det_kcp([0, 34], 1), None, 0, DEV)
    for ws, match in ((KDADetKCPWorkspace.for_context(plan, ring, num_v_heads=1), ctx_msg),
                      (KDADetKCPWorkspace.for_context(plan, other_p, num_v_heads=1), ctx_msg),
                      (KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=2), ctx_msg),
                      (KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=1,
                                                      dtype=torch.bfloat16), ctx_msg),
                      (KDADetKCPWorkspace.for_context(other_plan, ctx, num_v_heads=1),
                       "was made for plan")):
        with pytest.raises(ValueError, match=f"^workspace: .*{match}"):
            chunk_kda_det_bwd_kcp(local[5], saved, ctx, workspace=ws)


def test_plans_of_another_type_mode_or_shape(setup, no_work):
    from cake_kda_det_train import make_plan

    ctx, local, saved = setup
    with pytest.raises(ValueError, match="^plan: got OtherPlan"):
        chunk_kda_det_bwd_kcp(local[5], saved, ctx, plan=OtherPlan())
    with pytest.raises(ValueError, match="^plan: got OtherPlan"):
        chunk_kda_det_fwd_kcp(*local[:5], ctx, plan=OtherPlan())
    with pytest.raises(ValueError, match="^plan: got dict"):
        chunk_kda_det_kcp(*local[:5], ctx, plan=make_plan(16, 16, torch.float32, DEV).to_dict())
    with pytest.raises(ValueError, match="^plan: made for K=16, V=32"):
        chunk_kda_det_fwd_kcp(*local[:5], ctx, plan=make_plan(16, 32, torch.float32, DEV))
    with pytest.raises(ValueError, match="^plan"):
        chunk_kda_det_bwd_kcp(local[5], saved, ctx, plan=make_plan(32, 16, torch.float32, DEV))


def test_saved_set_of_another_context(setup, no_work):
    ctx, local, saved = setup
    for other in (build_context_det_kcp(ctx.partition, None, 0, DEV, exchange="ring"),
                  build_context_det_kcp(partition_det_kcp([0, 34], 1), None, 0, DEV)):
        with pytest.raises(ValueError, match=r"^saved: made on \(partition, rank, exchange\)"):
            chunk_kda_det_bwd_kcp(local[5], saved, other)
