"""cp1 and in-process parity: world size 1 equals the single-rank package bitwise; a
one-rank partition whose documents cross its own fragments (halos from one, two or three
earlier fragments, 1-token fragments) runs the halo assembly and the ordered halo-gradient
sums against the single-rank package and float64."""

import pytest
import torch
from _conv_kcp_helpers import (
    CROSS_CU,
    CROSS_ROWS,
    DEV,
    NAMES,
    TOL,
    autograd_run,
    global_inputs,
    kcp_run,
    reference64,
    shard,
    single_rank,
)
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPWorkspace,
    build_context_det_kcp,
    partition_det_kcp,
)
from cake_core.testing import TOLERANCES, bitwise_equal, poison_, rel_fro_error


def _same(a, b):
    return all((x is None and y is None) or bitwise_equal(x, y) for x, y in zip(a, b,
                                                                                strict=True))


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_cp1_bitwise_equal_to_single_rank(W, activation):
    """World size 1 (documents on one rank, an empty and a 1-token one): y and every
    gradient bitwise the single-rank package's, low level and autograd, with and without
    bias and reduce_weight_grads, both layouts (equal at W = 1)."""
    cu = [0, 5, 5, 40, 41, 70]
    bias = activation is None or W == 3
    xs = global_inputs(70, 8, W, bias=bias, seed=W)
    ref = single_rank(xs, cu, activation)
    for layout in ("contiguous", "zigzag"):
        p = partition_det_kcp(torch.tensor(cu), 1, layout)
        ctx = build_context_det_kcp(p, None, 0, DEV, W)
        got = kcp_run(xs, ctx, activation)
        assert _same(got, ref), layout
    assert _same(kcp_run(xs, ctx, activation, reduce_weight_grads=True), ref)
    assert _same(autograd_run(xs, ctx, activation, reduce_weight_grads=W == 2), ref)


@pytest.mark.parametrize("W", [2, 3, 4])
def test_crossing_on_one_rank(W):
    """Documents split into fragments that are not adjacent on rank 0 (halos from earlier
    fragments of the same rank, one of them spanning three fragments for W = 4): within
    fp32 tolerance of the single-rank package and of float64, repeated bitwise, the
    autograd entry bitwise the low-level pair."""
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, W)
    assert len(ctx.halo) == 5
    if W == 4:
        assert max(len(e.pieces) for e in ctx.halo) == 3
    xs = global_inputs(60, 8, W, seed=10 + W)
    local = shard(xs, p)
    idx = p.global_index(0).to(DEV)
    act = "silu" if W != 3 else None
    got = kcp_run(local, ctx, act)
    for label, ref in (("local", single_rank(xs, CROSS_CU, act)),
                       ("float64", reference64(xs, CROSS_CU, act))):
        for n, a, b in zip(NAMES, got, ref, strict=True):
            b = b[:, idx] if n in ("y", "dx") else b
            assert rel_fro_error(a, b.to(a.dtype)) < TOL, f"{label}: {n}"
    assert _same(kcp_run(local, ctx, act), got)
    assert _same(autograd_run(local, ctx, act), got)


def test_halo_gradient_order_is_fixed():
    """The same partition and inputs, the fragments' halo gradients added in another
    order (reversed rounds): other bits for some token. The fixed document order is what
    the repeat tests rely on, so they could fail."""
    import cake_causal_conv1d_det_train_kcp.api as api
    from cake_causal_conv1d_det_train_kcp.context import DeviceHalo

    p = partition_det_kcp([0, 8, 20], 1, fragments=[(0, 0, 0, 5), (0, 1, 0, 6), (0, 0, 5, 1),
                                                   (0, 1, 6, 6), (0, 0, 6, 1), (0, 0, 7, 1)])
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    dh = api.device_halo(ctx)
    assert len(dh.rounds) >= 2
    xs = global_inputs(20, 64, 4, seed=3)
    local = shard(xs, p)
    base = kcp_run(local, ctx)
    flipped = DeviceHalo(**{**dh.__dict__, "rounds": dh.rounds[::-1]})
    differs = False
    try:
        from cake_causal_conv1d_det_train_kcp.context import _DEVICE_HALO

        _DEVICE_HALO[ctx] = flipped
        differs = not bitwise_equal(kcp_run(local, ctx)[1], base[1])
    finally:
        _DEVICE_HALO[ctx] = dh
    assert differs
    assert _same(kcp_run(local, ctx), base)


def test_bf16_with_workspace():
    """bf16 x, weight and bias on a crossing partition with a reused NaN-poisoned
    workspace: the same bits as without one; the dweight / dbias shares stay fp32 until
    their one cast (the local call runs with an fp32 copy of the weight); world size 1 is
    bitwise the single-rank package in bf16 too."""
    from cake_causal_conv1d_det_train import make_plan

    xs = global_inputs(60, 16, 4, dtype=torch.bfloat16, seed=14)
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    local = shard(xs, p)
    plain = kcp_run(local, ctx, "silu")
    plan = make_plan(16, 4, torch.bfloat16, DEV)
    ws = CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=torch.bfloat16)
    for name in ws.names:
        poison_(ws[name])
    for name in ws.local.names:
        poison_(ws.local[name])
    for _ in range(2):
        assert _same(kcp_run(local, ctx, "silu", plan=plan, workspace=ws), plain)
    ref = single_rank(xs, CROSS_CU, "silu")
    idx = p.global_index(0).to(DEV)
    for n, a, b in zip(NAMES, plain, ref, strict=True):
        b = b[:, idx] if n in ("y", "dx") else b
        assert a.dtype == b.dtype == torch.bfloat16
        assert rel_fro_error(a, b) < TOLERANCES[torch.bfloat16], n
    one = build_context_det_kcp(partition_det_kcp(CROSS_CU, 1), None, 0, DEV, 4)
    assert _same(kcp_run(xs, one, "silu"), ref)
