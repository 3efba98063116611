"""cp1 and in-process parity: world size 1 equals the single-rank package bitwise; a
one-rank partition whose documents cross its own fragments runs the whole exchange
algorithm (all-gather fold, ring hand-offs) against the single-rank package."""

import torch
from _kda_kcp_helpers import (
    CHAIN_CU,
    CHAIN_ROWS,
    DEV,
    GATE_TOL,
    NAMES,
    TOL,
    autograd_run,
    global_inputs,
    kcp_run,
    local_rows,
    shard,
    single_rank,
)
from cake_core.testing import TOLERANCES, bitwise_equal, poison_, rel_fro_error
from cake_kda_det_train_kcp import (
    KDADetKCPWorkspace,
    build_context_det_kcp,
    partition_det_kcp,
)

ALL = (*NAMES, "dA_log", "ddt_bias")


def _same(got, want, label):
    for n, a, b in zip(ALL, got, want, strict=True):
        assert (a is None) == (b is None), f"{label}: {n}"
        assert a is None or bitwise_equal(a, b), f"{label}: {n}"


def _close(got, want, label, tol=TOL):
    for n, a, b in zip(ALL, got, want, strict=True):
        assert (a is None) == (b is None), f"{label}: {n}"
        if a is not None:
            err = rel_fro_error(a, b)
            assert err < (GATE_TOL if n.startswith("dA") or n.startswith("ddt") else tol), \
                f"{label}: {n} rel. error {err:.2e}"


def test_cp1_bitwise_equal_to_single_rank():
    """W = 1 (no crossing: one single-rank call): empty documents, a 1-token one, FLA's gate
    and beta sigmoid, GVA (HV = 2H), K != V; o and every gradient (dA_log, ddt_bias too),
    low level and autograd, bitwise the single-rank package's. (The ring without crossing
    takes the same path: the benchmark's smoke test checks it gives the same bits.)"""
    cu = [0, 0, 1, 1, 12]
    xs, kw = global_inputs(cu[-1], H=1, HV=2, K=16, V=32, seed=11, kind="gate")
    ref = single_rank(xs, cu, kw)
    p = partition_det_kcp(torch.tensor(cu), 1, "zigzag")
    ctx = build_context_det_kcp(p, None, 0, DEV)
    assert not ctx.crosses
    _same(kcp_run(xs, ctx, kw), ref, "low level")
    _same(autograd_run(xs, ctx, kw), ref, "autograd")


def test_crossing_on_one_rank_matches_single_rank():
    """Document 0 in three fragments (first, middle, last), document 1 in two, all on rank
    0, with FLA's gate (dt_bias, beta sigmoid) and K != V (the transition run's own plan):
    both exchanges within fp32 tolerance of the single-rank package (dA_log / ddt_bias
    too). The two exchanges round differently (the fold reassociates the recurrence):
    their bits differ, so a repeat test can tell an order change (repeats and the
    autograd entry: the gloo tests)."""
    xs, kw = global_inputs(CHAIN_CU[-1], V=32, seed=12, kind="gate")
    ref = single_rank(xs, CHAIN_CU, kw)
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    local = shard(xs, p)
    want = local_rows(ref, p)
    runs = {}
    for exchange in ("allgather", "ring"):
        ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
        assert ctx.crosses and len(ctx.recv) == 3 and len(ctx.send) == 3
        runs[exchange] = kcp_run(local, ctx, kw)
        _close(runs[exchange], want, exchange)
    assert not all(bitwise_equal(a, b) for a, b in zip(runs["allgather"], runs["ring"],
                                                          strict=True))


def test_ring_on_chunk_boundaries_reproduces_single_rank_bits():
    """Every cut at a multiple of 64 tokens inside its document: the ring hands on the
    exact fp32 states the single-rank kernel carries between chunks, so o and every
    per-token gradient are bitwise the single-rank package's (with the lower-bound gate
    and the L2 norm). dA_log sums over other token groups: within tolerance. (The
    all-gather folds P S + Q instead: within tolerance only, docs/kcp.md.)"""
    cu = [0, 128, 138]
    rows = [(0, 0, 0, 64), (0, 1, 0, 10), (0, 0, 64, 64)]
    p = partition_det_kcp(cu, 1, fragments=rows)
    xs, kw = global_inputs(138, seed=13, kind="gate_lb")
    local = shard(xs, p)
    want = local_rows(single_rank(xs, cu, kw), p)
    ring = kcp_run(local, build_context_det_kcp(p, None, 0, DEV, exchange="ring"), kw)
    for n, a, b in zip(NAMES, ring, want, strict=False):
        assert bitwise_equal(a, b), f"ring: {n}"
    _close(ring, want, "ring")


def test_bf16_with_workspace():
    """bf16 inputs (K = V = 32), the all-gather, a reused NaN-poisoned workspace: the same
    bits as without one (with ``reduce_gate_param_grads=False``: on one rank the share is
    the sum), close to the single-rank package (bf16 tolerance); the softplus gate's
    parameters in bf16 (their gradients summed in fp32, cast once; a sum over tokens of
    terms of both signs, so its relative error is larger: 5e-2)."""
    from cake_kda_det_train import make_plan

    cu, rows = [0, 20, 25], [(0, 0, 0, 10), (0, 1, 0, 5), (0, 0, 10, 10)]
    xs, kw = global_inputs(cu[-1], K=32, V=32, dtype=torch.bfloat16, seed=14, kind="gate")
    kw["A_log"], kw["dt_bias"] = kw["A_log"].bfloat16(), kw["dt_bias"].bfloat16()
    ref = single_rank(xs, cu, kw)
    p = partition_det_kcp(cu, 1, fragments=rows)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    local = shard(xs, p)
    plain = kcp_run(local, ctx, kw)
    plan = make_plan(32, 32, torch.bfloat16, DEV)
    ws = KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=1, dtype=torch.bfloat16)
    for t in (ws["fwd_send"], ws["fwd_recv"], ws["bwd_send"], ws["bwd_recv"],
              *(ws.local[n] for n in ws.local.names)):
        poison_(t)
    got = kcp_run(local, ctx, kw, plan=plan, workspace=ws, reduce_gate_param_grads=False)
    _same(got, plain, "poisoned workspace")
    assert plain[6].dtype == torch.bfloat16 and plain[7].dtype == torch.bfloat16
    for n, a, b in zip(ALL, plain, local_rows(ref, p), strict=True):
        assert a.dtype == b.dtype
        tol = 5e-2 if n in ("dA_log", "ddt_bias") else TOLERANCES[torch.bfloat16]
        assert rel_fro_error(a, b) < tol, n


def test_keep_states_plan_same_bits():
    """A plan with ``keep_states = 1`` (the local forwards keep h, w, kg and v_new; their
    backwards skip the recompute): the same bits as the rule's plan through both exchanges,
    low level and autograd, documents crossing fragments (the all-gather's and the ring's
    local runs start from the exchanged states)."""
    import dataclasses

    from cake_kda_det_train import make_plan

    xs, kw = global_inputs(CHAIN_CU[-1], V=32, seed=15, kind="gate")
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    local = shard(xs, p)
    redo = make_plan(xs[0].shape[-1], 32, xs[0].dtype, DEV)
    keep = dataclasses.replace(redo, keep_states=1)
    for exchange in ("allgather", "ring"):
        ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
        _same(kcp_run(local, ctx, kw, plan=keep), kcp_run(local, ctx, kw, plan=redo),
              f"{exchange} low level")
        _same(autograd_run(local, ctx, {**kw, "plan": keep}),
              autograd_run(local, ctx, {**kw, "plan": redo}), f"{exchange} autograd")
