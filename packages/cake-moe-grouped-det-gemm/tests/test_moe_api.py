"""The low-level fwd/bwd, main_grad accumulation, workspaces, plans, custom ops, imports."""

import dataclasses
import json

import torch
from _moe_cases import DEV, make
from cake_core.testing import (
    assert_imports_without_triton,
    bitwise_equal,
    poison_,
    randn,
)
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetGrads,
    MoEGroupedDetPlan,
    MoEGroupedDetWorkspace,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)
from cake_moe_grouped_det_gemm.plan import MAX_WGRAD_SPLITS

SIZES = [9, 0, 22, 1, 14]


def _split_plan(x, w, splits=3):
    M, (E, N, K) = x.shape[0], w.shape
    return dataclasses.replace(make_plan(M, E, N, K, x.dtype, DEV), wgrad_splits=splits,
                               wgrad_block_k=16)


def test_low_level_matches_autograd_bitwise():
    x, w, offs, dy = make(SIZES, tail=3)
    y, saved = moe_grouped_det_gemm_fwd(x, w, offs)
    g = moe_grouped_det_gemm_bwd(dy, saved)
    assert isinstance(g, MoEGroupedDetGrads) and g._fields == ("dx", "dweight")
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y2 = moe_grouped_det_gemm(xx, ww, offs)
    y2.backward(dy)
    for a, b in ((y, y2), (g.dx, xx.grad), (g.dweight, ww.grad)):
        assert bitwise_equal(a, b.detach())


def test_main_grad_two_steps_is_ordered_sum_added_once():
    """main_grad after two backwards equals (mg + dW1) + dW2 of fp32 dW, bit for bit, with a
    split plan; weight gets no gradient and nothing else is allocated for dW."""
    x, w, offs, dy = make(SIZES)
    plan = _split_plan(x, w)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    mg0 = randn(w.shape, torch.float32, DEV, seed=9)
    dy2 = randn(dy.shape, dy.dtype, DEV, seed=10)
    mg = mg0.clone()
    ww = w.clone().requires_grad_()
    for d in (dy, dy2):
        moe_grouped_det_gemm(x, ww, offs, plan=plan, workspace=ws, main_grad=mg).backward(d)
    assert ww.grad is None
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    d1 = moe_grouped_det_gemm_bwd(dy, saved).dweight
    d2 = moe_grouped_det_gemm_bwd(dy2, saved).dweight
    assert bitwise_equal(mg, (mg0 + d1) + d2)
    lo = moe_grouped_det_gemm_bwd(dy, saved, main_grad=mg0.clone())
    assert lo.dweight is None


def test_main_grad_no_split():
    x, w, offs, dy = make(SIZES)
    plan = _split_plan(x, w, splits=1)
    mg0 = randn(w.shape, torch.float32, DEV, seed=9)
    mg = mg0.clone()
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    moe_grouped_det_gemm_bwd(dy, saved, main_grad=mg)
    assert bitwise_equal(mg, mg0 + moe_grouped_det_gemm_bwd(dy, saved).dweight)


def test_poisoned_workspace_does_not_leak():
    """A NaN-filled workspace (and an empty expert, whose planes must be written) gives the
    bits of a fresh one."""
    x, w, offs, dy = make(SIZES, tail=2)
    plan = _split_plan(x, w, splits=4)
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    fresh = moe_grouped_det_gemm_bwd(dy, saved)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    poison_(ws["partials"])
    g = moe_grouped_det_gemm_bwd(dy, saved, workspace=ws)
    assert torch.isfinite(g.dweight).all() and torch.isfinite(g.dx).all()
    assert bitwise_equal(g.dweight, fresh.dweight) and bitwise_equal(g.dx, fresh.dx)
    assert (g.dweight[1] == 0).all()


def test_strided_inputs_same_bits():
    x, w, offs, dy = make(SIZES, tail=1)
    y, saved = moe_grouped_det_gemm_fwd(x, w, offs)
    g = moe_grouped_det_gemm_bwd(dy, saved)
    xs = x.t().contiguous().t()                      # column-major x
    ws_ = w.transpose(1, 2).contiguous().transpose(1, 2)  # column-major experts
    dys = dy.t().contiguous().t()
    y2, saved2 = moe_grouped_det_gemm_fwd(xs, ws_, offs)
    g2 = moe_grouped_det_gemm_bwd(dys, saved2)
    assert bitwise_equal(y, y2) and bitwise_equal(g.dx, g2.dx)
    assert bitwise_equal(g.dweight, g2.dweight)


def test_custom_op_path_same_bits():
    """The torch.compile route (custom op + register_autograd) gives the eager bits."""
    from cake_core.compile import plan_to_op_fields
    from cake_moe_grouped_det_gemm.api import _row_ends

    x, w, offs, dy = make(SIZES, tail=2)
    plan = _split_plan(x, w)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = moe_grouped_det_gemm(xx, ww, offs, plan=plan)
    y.backward(dy)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    yo = torch.ops.cake_moe_grouped_det_gemm.fwd(xo, wo, _row_ends(offs, None, x.shape[0]),
                                                 plan_to_op_fields(plan), None, None)
    yo.backward(dy)
    for a, b in ((y, yo), (xx.grad, xo.grad), (ww.grad, wo.grad)):
        assert bitwise_equal(a.detach(), b.detach())


def test_plan_rule_serialisable_hashable():
    p = make_plan(4096, 8, 64, 48, torch.bfloat16, DEV)
    assert p == make_plan(4096, 8, 64, 48, torch.bfloat16, DEV)
    assert hash(p) == hash(make_plan(4096, 8, 64, 48, torch.bfloat16, DEV))
    assert MoEGroupedDetPlan.from_dict(json.loads(p.to_json())) == p
    assert p.key.startswith("MoEGroupedDetPlan:")
    assert 1 <= p.wgrad_splits <= MAX_WGRAD_SPLITS
    # a split plan on the CPU rule: one small expert tile, many rows per expert
    assert make_plan(4 * 1024, 1, 16, 16, torch.float32, "cpu").wgrad_splits > 1
    assert make_plan(64, 64, 16, 16, torch.float32, "cpu").wgrad_splits == 1


def test_workspace_independent_of_tokens():
    x, w, offs, dy = make(SIZES)
    plan = _split_plan(x, w)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    assert ws["partials"].shape == (3, *w.shape)
    x2, _, offs2, dy2 = make([1, 2, 0, 0, 30], tail=5, seed=3)
    _, saved = moe_grouped_det_gemm_fwd(x2, w, offs2, plan=plan)
    moe_grouped_det_gemm_bwd(dy2, saved, workspace=ws)


def test_import_without_triton_and_manifest():
    assert_imports_without_triton("cake_moe_grouped_det_gemm",
                                  "cake_moe_grouped_det_gemm.cake_build")
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name
    from cake_moe_grouped_det_gemm import __version__, cake_build

    m = cake_build.manifest()
    assert validate_manifest(m) == []
    assert m["version"] == __version__
    assert check_name("cake-moe-grouped-det-gemm") == []


def test_poisoned_outputs_fully_written():
    """Every element of y, dx and dW is written by the kernels (tail rows and empty experts
    included): NaN-filled output buffers come back NaN-free with the fresh bits."""
    from cake_moe_grouped_det_gemm import api

    x, w, offs, dy = make([0, 13, 0, 7, 1], tail=5)
    M, (E, N, K) = x.shape[0], w.shape
    ends = api._row_ends(offs, None, M)
    y_ref, saved = moe_grouped_det_gemm_fwd(x, w, offs)
    g_ref = moe_grouped_det_gemm_bwd(dy, saved)
    for splits in (1, 3):
        plan = _split_plan(x, w, splits)
        y = poison_(torch.empty(M, N, device=DEV))
        api._grouped_mm(x, w, y, ends, plan, (w.stride(0), w.stride(2), w.stride(1)))
        dx = poison_(torch.empty(M, K, device=DEV))
        api._grouped_mm(dy, w, dx, ends, plan, (w.stride(0), w.stride(1), w.stride(2)))
        dw = poison_(torch.empty(E, N, K, device=DEV))
        parts = poison_(torch.empty(splits, E, N, K, device=DEV)) if splits > 1 else None
        api._launch_wgrad(dy, x, ends, plan, dw, parts, False)
        assert bitwise_equal(y, y_ref) and bitwise_equal(dx, g_ref.dx)
        if splits == 1:
            assert bitwise_equal(dw, g_ref.dweight)
        assert torch.isfinite(dw).all() and (dw[0] == 0).all() and (dw[2] == 0).all()
