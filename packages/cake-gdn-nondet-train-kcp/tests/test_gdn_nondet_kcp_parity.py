"""In one process (world size 1, a crossing fragment table): both exchanges against
cake-gdn-nondet-train on the global tensors; the autograd entry against the low-level
pair; with a workspace; K != V (the transition run's own plan)."""

import pytest
import torch
from _gdn_nd_kcp_helpers import (
    CROSS_CU,
    CROSS_ROWS,
    DEV,
    NAMES,
    global_inputs,
    kcp_run,
    shard,
    single_rank,
)
from cake_core.testing import bitwise_equal, rel_fro_error
from cake_gdn_nondet_train import make_nondet_plan
from cake_gdn_nondet_train_kcp import (
    GDNNondetKCPGrads,
    GDNNondetKCPSavedSet,
    GDNNondetKCPWorkspace,
    build_context_nondet_kcp,
    chunk_gated_delta_rule_nondet_kcp,
    chunk_gdn_nondet_fwd_kcp,
    comm_bytes_nondet,
    partition_nondet_kcp,
)

TOL = 2e-5


def _close(got, want):
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel_fro_error(a, b) < TOL, (name, rel_fro_error(a, b))


@pytest.mark.parametrize("exchange,l2", [("allgather", True), ("ring", False)],
                         ids=["allgather-l2", "ring"])
def test_crossing_partition_matches_single_rank(exchange, l2):
    p = partition_nondet_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_nondet_kcp(p, None, 0, DEV, exchange=exchange)
    xs = global_inputs(100, HV=2, seed=3)
    want = [t[:, p.global_index(0).to(DEV)] for t in single_rank(xs, CROSS_CU, l2)]
    got = kcp_run(shard(xs, p), ctx, l2)
    assert isinstance(got[1], torch.Tensor)
    _close(got, want)


def test_autograd_entry_equals_low_level_pair_with_workspace():
    p = partition_nondet_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    local = shard(global_inputs(100, HV=2, seed=5), p)
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    ws = GDNNondetKCPWorkspace.for_context(plan, ctx, num_v_heads=2)
    o, saved = chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, plan=plan, workspace=ws)
    assert isinstance(saved, GDNNondetKCPSavedSet) and saved.plan is plan
    assert all(type(s).__name__ == "GDNNondetSavedSet" for s in saved.local)
    first = kcp_run(local, ctx, plan=plan, workspace=ws)
    assert bitwise_equal(first[0], o)
    leaves = [t.clone().requires_grad_() for t in local[:5]]
    out = chunk_gated_delta_rule_nondet_kcp(*leaves, ctx)
    out.backward(local[5])
    for a, b in zip((out.detach(), *(t.grad for t in leaves)), first, strict=True):
        assert bitwise_equal(a, b)


def test_k_differs_from_v_and_grads_type():
    from cake_gdn_nondet_train_kcp import chunk_gdn_nondet_bwd_kcp

    p = partition_nondet_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    xs = global_inputs(100, K=16, V=32, seed=7)
    want = [t[:, p.global_index(0).to(DEV)] for t in single_rank(xs, CROSS_CU)]
    local = shard(xs, p)
    plan = make_nondet_plan(16, 32, torch.float32, DEV)
    ws = GDNNondetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    assert ws.local_p is not None and ws.local_p.mode.value == "nondet"
    o, saved = chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, workspace=ws)
    gr = chunk_gdn_nondet_bwd_kcp(local[5], saved, ctx, workspace=ws)
    assert isinstance(gr, GDNNondetKCPGrads)
    _close((o, *gr), want)
    assert comm_bytes_nondet(ctx, 16, 32, 1)["calls"] == 2
