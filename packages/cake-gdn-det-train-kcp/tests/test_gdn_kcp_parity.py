"""cp1 and in-process parity: world size 1 equals the single-rank package bitwise; a
one-rank partition whose documents cross its own fragments runs the whole exchange
algorithm (all-gather fold, ring hand-offs) against the single-rank package."""

import pytest
import torch
from _gdn_kcp_helpers import (
    CROSS_CU,
    CROSS_ROWS,
    DEV,
    NAMES,
    global_inputs,
    kcp_run,
    shard,
    single_rank,
)
from cake_core.testing import TOLERANCES, bitwise_equal, poison_, rel_fro_error
from cake_gdn_det_train_kcp import (
    GDNDetKCPWorkspace,
    build_context_det_kcp,
    chunk_gated_delta_rule_det_kcp,
    chunk_gdn_det_fwd_kcp,
    partition_det_kcp,
)


def _autograd(local, ctx, l2=False):
    leaves = [t.clone().requires_grad_() for t in local[:5]]
    o = chunk_gated_delta_rule_det_kcp(*leaves, ctx, use_qk_l2norm_in_kernel=l2)
    o.backward(local[5])
    return (o.detach(), *(t.grad for t in leaves))


@pytest.mark.parametrize("l2", [False, True], ids=["plain", "l2n"])
def test_cp1_bitwise_equal_to_single_rank(l2):
    """W = 1: empty documents, a 1-token one, GVA; fwd and every grad, low level and
    autograd, bitwise the single-rank package's."""
    cu = [0, 5, 5, 70, 71, 100]
    xs = global_inputs(100, H=1, HV=2, K=16, V=32, seed=11)
    ref = single_rank(xs, cu, l2)
    p = partition_det_kcp(torch.tensor(cu), 1, "zigzag" if l2 else "contiguous")
    for exchange in ("allgather", "ring"):
        ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
        assert not ctx.crosses
        got = kcp_run(xs, ctx, l2)
        for n, a, b in zip(NAMES, got, ref, strict=True):
            assert bitwise_equal(a, b), f"{exchange}: {n}"
        if exchange == "allgather":
            for n, a, b in zip(NAMES, _autograd(xs, ctx, l2), ref, strict=True):
                assert bitwise_equal(a, b), f"autograd: {n}"


def test_crossing_on_one_rank_matches_single_rank():
    """Document 0 in three fragments (one middle), document 1 in two, all on rank 0: both
    exchanges within fp32 tolerance of the single-rank package, repeated bitwise, the
    autograd entry bitwise the low-level pair. The two exchanges round differently (the
    fold reassociates the recurrence): their bits differ, so a repeat test can tell an
    order change."""
    xs = global_inputs(100, H=1, HV=2, seed=12)
    ref = single_rank(xs, CROSS_CU)
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    local = shard(xs, p)
    idx = p.global_index(0).to(DEV)
    runs = {}
    for exchange in ("allgather", "ring"):
        ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
        assert ctx.crosses and len(ctx.recv) == 3 and len(ctx.send) == 3
        got = runs[exchange] = kcp_run(local, ctx)
        for n, a, b in zip(NAMES, got, ref, strict=True):
            assert rel_fro_error(a, b[:, idx]) < 2e-5, f"{exchange}: {n}"
        again = kcp_run(local, ctx)
        assert all(bitwise_equal(a, b) for a, b in zip(got, again, strict=True)), exchange
        if exchange == "allgather":
            for n, a, b in zip(NAMES, _autograd(local, ctx), got, strict=True):
                assert bitwise_equal(a, b), f"autograd: {n}"
    assert not all(bitwise_equal(a, b) for a, b in zip(runs["allgather"], runs["ring"],
                                                          strict=True))


def test_ring_on_chunk_boundaries_reproduces_single_rank_bits():
    """Every cut at a multiple of 64 tokens inside its document: the ring hands the exact
    fp32 states the single-rank kernel carries, so every output and gradient is bitwise
    the single-rank package's (with and without the L2 norm). The all-gather folds
    P S + Q instead: within tolerance only (docs/kcp.md)."""
    cu = [0, 150, 160]
    rows = [(0, 0, 0, 64), (0, 1, 0, 10), (0, 0, 64, 64), (0, 0, 128, 22)]
    p = partition_det_kcp(cu, 1, fragments=rows)
    xs = global_inputs(160, seed=13)
    local = shard(xs, p)
    idx = p.global_index(0).to(DEV)
    for l2 in (False, True):
        ref = single_rank(xs, cu, l2)
        ring = kcp_run(local, build_context_det_kcp(p, None, 0, DEV, exchange="ring"), l2)
        for n, a, b in zip(NAMES, ring, ref, strict=True):
            assert bitwise_equal(a, b[:, idx]), f"ring l2={l2}: {n}"
    ag = kcp_run(local, build_context_det_kcp(p, None, 0, DEV), True)
    for n, a, b in zip(NAMES, ag, ref, strict=True):
        assert rel_fro_error(a, b[:, idx]) < 2e-5, n


def test_bf16_with_workspace():
    """bf16 inputs (16-bit intermediates, K = V = 32), all-gather with a middle fragment,
    a reused NaN-poisoned workspace: the same bits as without one, close to the
    single-rank package (bf16 tolerance)."""
    from cake_gdn_det_train import make_plan

    xs = global_inputs(100, H=1, HV=1, K=32, V=32, dtype=torch.bfloat16, seed=14)
    ref = single_rank(xs, CROSS_CU)
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    local = shard(xs, p)
    plain = kcp_run(local, ctx)
    plan = make_plan(32, 32, torch.bfloat16, DEV)
    ws = GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=1, dtype=torch.bfloat16)
    for t in (ws["fwd_send"], ws["fwd_recv"], ws["bwd_send"], ws["bwd_recv"],
              *(ws.local[n] for n in ws.local.names)):
        poison_(t)
    for _ in range(2):
        got = kcp_run(local, ctx, plan=plan, workspace=ws)
        assert all(bitwise_equal(a, b) for a, b in zip(got, plain, strict=True))
    idx = p.global_index(0).to(DEV)
    for n, a, b in zip(NAMES, plain, ref, strict=True):
        assert a.dtype == b.dtype
        assert rel_fro_error(a, b[:, idx]) < TOLERANCES[torch.bfloat16], n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_keep_states_plan_same_bits(dtype):
    """``plan.keep_states = 1`` (each single-rank forward keeps its chunk states, w and
    v_new for its backward): both exchanges, with a reused workspace, low level and
    autograd, the bits of ``keep_states = 0``; the local saved sets hold the tensors."""
    import dataclasses

    from cake_gdn_det_train import make_plan

    xs = global_inputs(100, H=1, HV=2, K=32, V=32, dtype=dtype, seed=15)
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    local = shard(xs, p)
    redo = make_plan(32, 32, dtype, DEV)
    keep = dataclasses.replace(redo, keep_states=1)
    for exchange in ("allgather", "ring"):
        ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
        want = kcp_run(local, ctx, plan=redo)
        ws = GDNDetKCPWorkspace.for_context(keep, ctx, num_v_heads=2, dtype=dtype)
        for _ in range(2):
            got = kcp_run(local, ctx, plan=keep, workspace=ws)
            for n, a, b in zip(NAMES, got, want, strict=True):
                assert bitwise_equal(a, b), f"{exchange}: {n}"
        _, saved = chunk_gdn_det_fwd_kcp(*local[:5], ctx, plan=keep)
        assert saved.local and all(s.h is not None and s.w is not None
                                   and s.v_new is not None for s in saved.local)
        leaves = [t.clone().requires_grad_() for t in local[:5]]
        o = chunk_gated_delta_rule_det_kcp(*leaves, ctx, plan=keep)
        o.backward(local[5])
        for n, a, b in zip(NAMES, (o.detach(), *(t.grad for t in leaves)), want, strict=True):
            assert bitwise_equal(a, b), f"autograd {exchange}: {n}"
