"""Mode and type checks: the KCP backward takes only this package's det saved set and
workspace (not the single-rank package's, not one of its own types carrying another
mode), and refuses them before any launch or collective. The refusal of the real
non-deterministic sibling's objects (cake-gdn-nondet-train-kcp, which depends on this
package) is tested in that package's tests."""

import dataclasses
from typing import ClassVar

import cake_gdn_det_train_kcp.api as kcp_api
import pytest
import torch
from _gdn_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_core import Mode, Plan
from cake_gdn_det_train_kcp import (
    GDNDetKCPSavedSet,
    GDNDetKCPWorkspace,
    build_context_det_kcp,
    chunk_gdn_det_bwd_kcp,
    chunk_gdn_det_fwd_kcp,
    partition_det_kcp,
)


@dataclasses.dataclass(frozen=True)
class OtherPlan(Plan):
    family: ClassVar[str] = "cake-other-det-train"
    block: int = 16


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    local = shard(global_inputs(100, seed=21), p)
    _, saved = chunk_gdn_det_fwd_kcp(*local[:5], ctx)
    return ctx, local, saved


@pytest.fixture
def no_work(monkeypatch):
    """Any launch or collective fails the test."""
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in ("chunk_gdn_det_bwd", "chunk_gdn_det_fwd", "forward_allgather", "forward_ring",
                 "backward_allgather", "backward_ring"):
        monkeypatch.setattr(kcp_api, name, boom)


def test_backward_refuses_foreign_saved_sets(setup, no_work):
    ctx, local, saved = setup
    own = dict(zip(saved.tensor_names, saved.tensors()[:len(saved.tensor_names)], strict=True))
    nondet_same_type = GDNDetKCPSavedSet(Mode.NONDET, own, saved.meta, saved.local)
    foreign = {
        "GDNDetSavedSet": saved.local[0],                       # the single-rank package's
        "GDNDetKCPSavedSet with mode=nondet": nondet_same_type,
        "dict": own,
    }
    for label, obj in foreign.items():
        with pytest.raises(ValueError, match=r"^saved: got .*expected GDNDetKCPSavedSet with "
                                             r"mode=det"):
            chunk_gdn_det_bwd_kcp(local[5], obj, ctx)
        assert label


def test_backward_refuses_foreign_workspaces(setup, no_work):
    from cake_gdn_det_train import GDNDetWorkspace, make_plan

    ctx, local, saved = setup
    plan = make_plan(16, 16, torch.float32, DEV)
    det_local = GDNDetWorkspace.for_plan(plan, DEV, num_v_heads=1, max_tokens=100, max_seqs=6)
    own_nondet = GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    own_nondet.mode = Mode.NONDET
    for obj, match in ((det_local, "got GDNDetWorkspace"),
                       (own_nondet, "got GDNDetKCPWorkspace with mode=nondet")):
        for call in (lambda o: chunk_gdn_det_bwd_kcp(local[5], saved, ctx, workspace=o),
                     lambda o: chunk_gdn_det_fwd_kcp(*local[:5], ctx, workspace=o)):
            with pytest.raises(ValueError, match=f"^workspace: {match}"):
                call(obj)


def test_workspace_of_another_context_plan_or_dtype(setup, no_work):
    from cake_gdn_det_train import make_plan

    ctx, local, saved = setup
    plan = make_plan(16, 16, torch.float32, DEV)
    assert plan == saved.plan  # the cases below differ from the forward's in one thing
    # another plan: a gate block the rule did not choose (the rule picks 128 on CUDA,
    # 256 on the CPU, so a fixed value can be the plan itself)
    other_plan = dataclasses.replace(plan, gate_block_t=2 * plan.gate_block_t)
    assert other_plan != plan
    ctx_msg = r"made for \(partition"
    ring = build_context_det_kcp(ctx.partition, None, 0, DEV, exchange="ring")
    other_p = build_context_det_kcp(partition_det_kcp([0, 100], 1), None, 0, DEV)
    for ws, match in ((GDNDetKCPWorkspace.for_context(plan, ring, num_v_heads=1), ctx_msg),
                      (GDNDetKCPWorkspace.for_context(plan, other_p, num_v_heads=1), ctx_msg),
                      (GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=2), ctx_msg),
                      (GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=1,
                                                      dtype=torch.bfloat16), ctx_msg),
                      (GDNDetKCPWorkspace.for_context(other_plan, ctx, num_v_heads=1),
                       "was made for plan")):
        with pytest.raises(ValueError, match=f"^workspace: .*{match}"):
            chunk_gdn_det_bwd_kcp(local[5], saved, ctx, workspace=ws)


def test_plans_of_another_type_or_shape(setup, no_work):
    from cake_gdn_det_train import make_plan

    ctx, local, saved = setup
    with pytest.raises(ValueError, match="^plan: got OtherPlan"):
        chunk_gdn_det_bwd_kcp(local[5], saved, ctx, plan=OtherPlan())
    with pytest.raises(ValueError, match="^plan: got OtherPlan"):
        chunk_gdn_det_fwd_kcp(*local[:5], ctx, plan=OtherPlan())
    with pytest.raises(ValueError, match="^plan: made for K=16, V=32"):
        chunk_gdn_det_fwd_kcp(*local[:5], ctx, plan=make_plan(16, 32, torch.float32, DEV))


def test_saved_set_of_another_context(setup, no_work):
    ctx, local, saved = setup
    for other in (build_context_det_kcp(ctx.partition, None, 0, DEV, exchange="ring"),
                  build_context_det_kcp(partition_det_kcp([0, 100], 1), None, 0, DEV)):
        with pytest.raises(ValueError, match=r"^saved: made on \(partition, rank, exchange\)"):
            chunk_gdn_det_bwd_kcp(local[5], saved, other)
