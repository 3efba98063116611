"""Plan field ``wgrad_order``: the wgrad's expert tiles launched with the experts of most
rows first (a device-side stable sort). The launch order only: every dW / main_grad bit
equals ``wgrad_order = 0``'s; the kernels really read the order (a wrong one shows)."""

import dataclasses
import json

import pytest
import torch
from _moe_cases import DEV, make
from cake_core.testing import bitwise_equal, poisoned_empty, randn
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetPlan,
    api,
    make_plan,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)

SKEWED = [0, 300, 1, 0, 57, 1000, 3, 64]


def _plan(x, w, splits, order, **over):
    M, (E, N, K) = x.shape[0], w.shape
    return dataclasses.replace(make_plan(M, E, N, K, x.dtype, DEV), wgrad_splits=splits,
                               wgrad_block_k=16, wgrad_order=order, **over)


def _grads(x, w, offs, dy, plan, main_grad=None):
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    return moe_grouped_det_gemm_bwd(dy, saved, plan=plan, main_grad=main_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("splits", [1, 3])
def test_same_bits_as_expert_order(dtype, splits):
    x, w, offs, dy = make(SKEWED, N=24, K=40, dtype=dtype, tail=5, seed=3)
    g0 = _grads(x, w, offs, dy, _plan(x, w, splits, 0))
    g1 = _grads(x, w, offs, dy, _plan(x, w, splits, 1))
    assert bitwise_equal(g0.dx, g1.dx) and bitwise_equal(g0.dweight, g1.dweight)
    mg = randn(w.shape, torch.float32, DEV, seed=9)
    a0, a1 = mg.clone(), mg.clone()
    _grads(x, w, offs, dy, _plan(x, w, splits, 0), main_grad=a0)
    _grads(x, w, offs, dy, _plan(x, w, splits, 1), main_grad=a1)
    assert bitwise_equal(a0, a1)
    ref = torch.stack([dy[s:e].double().t() @ x[s:e].double() for s, e in
                       zip([0, *offs.tolist()[:-1]], offs.tolist(), strict=True)])
    assert float((g1.dweight.double() - ref).abs().max()) <= 2e-2 * float(ref.abs().max())


def test_expert_order_most_rows_first_ties_in_index_order():
    offs = torch.tensor([5, 5, 10, 19, 19, 20], dtype=torch.int32, device=DEV)  # 5 0 5 9 0 1
    assert api._expert_order(offs).tolist() == [3, 0, 2, 5, 1, 4]
    balanced = torch.arange(1, 9, dtype=torch.int32, device=DEV) * 16
    assert api._expert_order(balanced).tolist() == list(range(8))


def test_kernels_read_the_order(monkeypatch):
    """With an order that is not a permutation (every slot expert 0), the tiles of the
    other experts are never written: dW differs (poisoned) where the true order gives the
    expert-order bits."""
    x, w, offs, dy = make(SKEWED, N=24, K=40, seed=4)
    plan = _plan(x, w, 1, 1)
    good = _grads(x, w, offs, dy, plan).dweight
    monkeypatch.setattr(api, "_expert_order",
                        lambda ends: torch.zeros_like(ends, dtype=torch.int32))
    with poisoned_empty():
        bad = _grads(x, w, offs, dy, plan).dweight
    assert not bitwise_equal(good, bad)


def test_plan_field_format():
    x, w, offs, dy = make(SKEWED, N=24, K=40)
    plan = _plan(x, w, 1, 0)
    # the rule: 1 on CUDA (H200 timing, docs/benchmarks/moe.md), 0 on the CPU
    assert make_plan(100, 8, 24, 40, torch.float32, DEV).wgrad_order == \
        int(torch.device(DEV).type == "cuda")
    p = dataclasses.replace(plan, wgrad_order=1)
    d = p.to_dict()
    assert d["wgrad_order"] == 1 and d["version"] == 4
    assert MoEGroupedDetPlan.from_dict(json.loads(p.to_json())) == p and p.key != plan.key
    v3 = {k: v for k, v in d.items() if k != "wgrad_order"}
    v3["version"] = 3
    with pytest.raises(ValueError, match="format version 3 is not 4: .*add wgrad_order = 0"):
        MoEGroupedDetPlan.from_dict(v3)
    with pytest.raises(ValueError, match="wgrad_order"):
        MoEGroupedDetPlan.from_dict({**v3, "version": 4})
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="wgrad_order"):
            dataclasses.replace(plan, wgrad_order=bad)


@pytest.mark.parametrize("order", [0, 1])
def test_grouped_tile_order_covers_every_tile(order):
    """The wgrad's tiles of one expert launch in groups of ``WGRAD_GROUP`` tile rows: with
    11 tile rows (a group of 8 and one of 3) and 3 tile columns every tile is still summed
    once, into main_grad and into a fresh dW (float64 reference)."""
    from cake_moe_grouped_det_gemm.kernels.grouped import WGRAD_GROUP

    assert int(WGRAD_GROUP) == 8
    x, w, offs, dy = make([40, 0, 70, 17], N=16 * 11, K=16 * 3, dtype=torch.float32,
                          tail=3, seed=5)
    plan = _plan(x, w, 1, order, wgrad_block_m=16, wgrad_block_n=16)
    bounds = [0, *offs.tolist()]
    ref = torch.stack([dy[s:e].double().t() @ x[s:e].double()
                       for s, e in zip(bounds[:-1], bounds[1:], strict=True)])
    g = _grads(x, w, offs, dy, plan)
    assert float((g.dweight.double() - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    mg = randn(w.shape, torch.float32, DEV, seed=2)
    start = mg.clone()
    _grads(x, w, offs, dy, plan, main_grad=mg)
    assert float((mg.double() - start.double() - ref).abs().max()) <= \
        1e-4 * float(ref.abs().max())
