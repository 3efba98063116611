"""The KCP route of cake-kda-nondet-train on one process (explicit fragments that cross):
both exchanges, the autograd entry and a workspace, K != V (the transition run's own plan),
against cake-kda-nondet-train on the global tensors; byte counts as the det route's."""

import pytest
import torch
from _kda_nd_kcp_helpers import (
    CHAIN_CU,
    CHAIN_ROWS,
    DEV,
    assert_close_all,
    autograd_run,
    global_inputs,
    kcp_run,
    local_rows,
    shard,
    single_rank,
)
from cake_kda_det_train_kcp import comm_bytes
from cake_kda_nondet_train import make_nondet_plan
from cake_kda_nondet_train_kcp import (
    KDANondetKCPGrads,
    KDANondetKCPWorkspace,
    build_context_nondet_kcp,
    comm_bytes_nondet,
    partition_nondet_kcp,
)


@pytest.fixture(scope="module")
def chain():
    p = partition_nondet_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=5)
    return p, xs, kw, local_rows(single_rank(xs, CHAIN_CU, kw), p)


@pytest.mark.parametrize("exchange", ["allgather", "ring"])
def test_chain_against_single_rank(chain, exchange):
    p, xs, kw, want = chain
    ctx = build_context_nondet_kcp(p, None, 0, DEV, exchange=exchange)
    assert_close_all(kcp_run(shard(xs, p), ctx, kw), want)


def test_autograd_and_workspace(chain):
    p, xs, kw, want = chain
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    assert_close_all(autograd_run(shard(xs, p), ctx, kw), want)
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    ws = KDANondetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    got = kcp_run(shard(xs, p), ctx, kw, plan=plan, workspace=ws)
    assert_close_all(got, want)


def test_k_ne_v_transition_plan():
    """K = 16, V = 32, the plain decay: the transition run (width K) takes
    make_nondet_plan(K, K) (the workspace's ``local_p``)."""
    p = partition_nondet_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    xs, kw = global_inputs(CHAIN_CU[-1], V=32, seed=9, gate=False)
    want = local_rows(single_rank(xs, CHAIN_CU, kw), p)
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    ws = KDANondetKCPWorkspace.for_context(make_nondet_plan(16, 32, torch.float32, DEV), ctx,
                                           num_v_heads=1)
    assert ws.local_p is not None and ws.local_p.plan_key == \
        make_nondet_plan(16, 16, torch.float32, DEV).key
    got = kcp_run(shard(xs, p), ctx, kw, workspace=ws)
    assert_close_all(got, want)


def test_grads_type_and_byte_counts(chain):
    from cake_kda_nondet_train_kcp import chunk_kda_nondet_bwd_kcp, chunk_kda_nondet_fwd_kcp

    p, xs, kw, _ = chain
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    local = shard(xs, p)
    _, saved = chunk_kda_nondet_fwd_kcp(*local[:5], ctx, **kw)
    assert type(chunk_kda_nondet_bwd_kcp(local[5], saved, ctx)) is KDANondetKCPGrads
    for ex in ("allgather", "ring"):
        c = build_context_nondet_kcp(p, None, 0, DEV, exchange=ex)
        assert comm_bytes_nondet(c, 16, 32, 2, gate_grad_floats=34) == \
            comm_bytes(c, 16, 32, 2, gate_grad_floats=34)
