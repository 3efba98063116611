"""Plan field ``grouped_mm_fwd_dgrad``: forward and dgrad on ``torch._grouped_mm`` (its CPU
fallback here, forced; the rule picks it on Hopper only), the rows past the last expert
zeroed by ``zero_tail_rows_kernel``, the wgrad still cake's. Parity with float64 on ragged
groups, exact zeros where torch leaves rows unwritten (simulated with NaN), the wgrad's bits
unchanged, repeats, strided inputs, torch.compile, refusals before launch, the rule and the
plan format; a GPU-only check of the rule's choice and its repeats."""

from __future__ import annotations

import dataclasses
import json

import cake_moe_grouped_det_gemm.api as api
import cake_moe_grouped_det_gemm.plan as plan_mod
import pytest
import torch
from _moe_cases import DEV, grouped_mm_route_missing, make
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_close_to_reference,
    assert_raises_unmodified,
    bitwise_equal,
    randn,
)
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetPlan,
    MoEGroupedDetWorkspace,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
    moe_grouped_gemm_reference,
)
from cake_moe_grouped_det_gemm.plan import grouped_mm_problem

pytestmark = pytest.mark.skipif(grouped_mm_route_missing() is not None,
                                reason=str(grouped_mm_route_missing()))

BF16 = torch.bfloat16
N_, K_ = 24, 40  # multiples of 8, not of 16

# (sizes per expert, rows past the last expert's end)
CASES = {
    "ragged_empty": ([7, 0, 19, 1, 0, 13], 0),
    "one_token_experts": ([1, 1, 1, 1], 0),
    "all_on_one": ([0, 0, 33, 0], 0),
    "single_expert": ([29], 0),
    "single_expert_tail": ([17], 5),
    "tail_rows": ([5, 0, 11], 9),
    "all_empty_tail": ([0, 0], 6),
    "no_tokens": ([0, 0, 0], 0),
}


def _plan(x, w, route=1, **kw):
    M, (E, N, K) = x.shape[0], w.shape
    return dataclasses.replace(make_plan(M, E, N, K, x.dtype, DEV), grouped_mm_fwd_dgrad=route,
                               **kw)


@pytest.fixture
def poisoned_grouped_mm(monkeypatch):
    """``torch._grouped_mm`` whose output rows past the last offset hold NaN (what an
    unwritten buffer may hold on a GPU; the CPU allocator often hands back zeros). Counts
    the calls."""
    real = torch._grouped_mm
    calls = []

    def poisoned(a, b, offs=None, **kw):
        out = real(a, b, offs=offs, **kw)
        out[int(offs[-1]):] = float("nan")
        calls.append((tuple(a.shape), tuple(b.shape)))
        return out

    monkeypatch.setattr(torch, "_grouped_mm", poisoned)
    return calls


@pytest.mark.parametrize("use_m_sizes", [False, True], ids=["offs", "m_sizes"])
@pytest.mark.parametrize("case", list(CASES))
def test_route_matches_float64(case, use_m_sizes, poisoned_grouped_mm):
    sizes, tail = CASES[case]
    x, w, offs, dy = make(sizes, N_, K_, BF16, tail, seed=3)
    plan = _plan(x, w)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    inputs = [t.clone() for t in (x, w, offs, dy)]
    if use_m_sizes:
        m_sizes = torch.tensor(sizes, dtype=torch.int32, device=DEV)
        y = moe_grouped_det_gemm(xx, ww, m_sizes=m_sizes, plan=plan)
    else:
        y = moe_grouped_det_gemm(xx, ww, offs, plan=plan)
    y.backward(dy)
    assert all(bitwise_equal(a, b) for a, b in zip(inputs, (x, w, offs, dy), strict=True))
    M = x.shape[0]
    assert len(poisoned_grouped_mm) == (2 if M else 0)  # fwd and dgrad; none for M = 0
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = moe_grouped_gemm_reference(x64, w64, offs, dtype=torch.float64)
    ref.backward(dy.double())
    assert y.dtype == BF16 and y.shape == ref.shape and y.is_contiguous()
    assert xx.grad.shape == x.shape and xx.grad.is_contiguous()
    for got, want in ((y, ref), (xx.grad, x64.grad), (ww.grad, w64.grad)):
        if want.numel() == 0 or want.abs().max() == 0:
            assert (got == 0).all()
        else:
            assert_close_to_reference(got.detach(), want.detach(), BF16)
    end = sum(sizes)
    assert (y[end:] == 0).all() and (xx.grad[end:] == 0).all()  # exact zeros, no NaN
    for e, m in enumerate(sizes):
        if m == 0:
            assert (ww.grad[e] == 0).all()


@pytest.mark.parametrize("M,n_cols,end", [(77, 136, 41), (77, 136, 0), (77, 136, 77),
                                           (64, 8, 32), (5, 300, 4), (1, 16, 0)])
def test_zero_tail_rows_kernel_writes_only_the_tail(M, n_cols, end):
    """Rows at or past the last end become 0; the rows before it are not touched (NaN
    stays NaN), whatever the row-block and column-step boundaries; a strided output."""
    from cake_core.testing import poison_

    base = poison_(torch.empty(M, n_cols + 3, dtype=BF16, device=DEV))
    out = base[:, 1:n_cols + 1]
    ends = torch.tensor([min(end, 3), end], dtype=torch.int32, device=DEV)
    api._zero_tail_rows(out, ends)
    assert torch.isnan(out[:end]).all() and (out[end:] == 0).all()
    assert torch.isnan(base[:, 0]).all() and torch.isnan(base[:, n_cols + 1:]).all()


def test_route_close_to_cake_kernels_and_wgrad_bits_unchanged():
    """y and dx close to route 0 (bits not promised equal); dW and main_grad bit for bit
    those of route 0 (the wgrad does not take the route), with and without a split."""
    x, w, offs, dy = make([9, 0, 22, 1, 14], N_, K_, BF16, tail=4, seed=5)
    for splits in (1, 3):
        on = _plan(x, w, wgrad_splits=splits, wgrad_block_k=16)
        off = dataclasses.replace(on, grouped_mm_fwd_dgrad=0)
        got, want = [], []
        for plan, out in ((on, got), (off, want)):
            y, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
            g = moe_grouped_det_gemm_bwd(dy, saved)
            mg = randn(w.shape, torch.float32, DEV, seed=9)
            moe_grouped_det_gemm_bwd(dy, saved, main_grad=mg,
                                     workspace=MoEGroupedDetWorkspace.for_plan(plan, DEV))
            out += [y, g.dx, g.dweight, mg]
        for a, b in zip(got[:2], want[:2], strict=True):
            assert_close_to_reference(a, b.double(), BF16)
        assert bitwise_equal(got[2], want[2]) and bitwise_equal(got[3], want[3])


def test_route_repeats_bitwise_with_other_work_between():
    x, w, offs, dy = make([150, 0, 1, 90], N_, K_, BF16, tail=3)
    plan = _plan(x, w, wgrad_splits=3, wgrad_block_k=16)

    def step():
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = moe_grouped_det_gemm(xx, ww, offs, plan=plan)
        y.backward(dy)
        return y, xx.grad, ww.grad

    def noise():
        a, b, o, _ = make([4, 4], N=16, K=16, dtype=BF16, seed=7)
        moe_grouped_det_gemm(a, b, o, plan=_plan(a, b)).sum()

    assert_bitwise_repeat(step, repeats=3, between=noise)


def test_route_strided_inputs_same_bits():
    """Views torch cannot read as row-major (column-major x, weight and dy, an unaligned
    start, an expanded dy) are copied contiguous first: the bits of contiguous inputs."""
    x, w, offs, dy = make([5, 8, 0, 3], N_, K_, BF16, tail=2, seed=9)
    plan = _plan(x, w)
    y, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    g = moe_grouped_det_gemm_bwd(dy, saved)
    xs = torch.zeros(x.shape[0], K_ + 1, dtype=BF16, device=DEV)
    xs[:, 1:] = x
    views = [(x.t().contiguous().t(), w.transpose(1, 2).contiguous().transpose(1, 2),
              dy.t().contiguous().t()),
             (xs[:, 1:], w, dy)]  # unaligned start, row stride K + 1
    for xv, wv, dyv in views:
        before = [t.clone() for t in (xv, wv, dyv)]
        y2, saved2 = moe_grouped_det_gemm_fwd(xv, wv, offs, plan=plan)
        g2 = moe_grouped_det_gemm_bwd(dyv, saved2)
        assert bitwise_equal(y, y2) and bitwise_equal(g.dx, g2.dx)
        assert bitwise_equal(g.dweight, g2.dweight)
        assert all(bitwise_equal(a, b) for a, b in zip(before, (xv, wv, dyv), strict=True))
    xx = x.clone().requires_grad_()
    moe_grouped_det_gemm(xx, w, offs, plan=plan).sum().backward()  # dy strides (0, 0)
    ones = torch.ones_like(dy)
    assert bitwise_equal(xx.grad, moe_grouped_det_gemm_bwd(ones, saved).dx)


def test_route_bad_offs_on_device_are_clamped():
    """Offsets the host does not check (on a GPU, or under compile) reach torch._grouped_mm
    only as the device-side clamped row ends: the result of the clamped offsets, no read or
    write out of bounds."""
    x, w, _, dy = make([3, 0, 5], N_, K_, BF16, tail=2)
    plan = _plan(x, w)
    M = x.shape[0]
    bad = torch.tensor([3, 2, 99], dtype=torch.int32, device=DEV)
    ends = api._row_ends(bad, None, M)
    assert ends.tolist() == [3, 3, M]
    good = torch.tensor([3, 3, M], dtype=torch.int32, device=DEV)
    want_y = moe_grouped_det_gemm(x, w, good, plan=plan)
    assert bitwise_equal(api._launch_fwd(x, w, ends, plan), want_y)
    neg = api._row_ends(torch.tensor([-4, 1, 1], dtype=torch.int32, device=DEV), None, M)
    y = api._launch_fwd(x, w, neg, plan)
    dx, _ = api._launch_bwd(dy, x, w, neg, plan, None, None, True, False)
    assert (y[1:] == 0).all() and (dx[1:] == 0).all()
    want = moe_grouped_gemm_reference(x[:1].double(), w.double(),
                                      torch.tensor([0, 1, 1], dtype=torch.int32))
    assert_close_to_reference(y[:1], want, BF16)


def test_route_custom_op_and_compile_same_bits():
    """Under torch.compile(fullgraph) the plan crosses the custom ops as ints and the route
    runs inside them: the eager bits."""
    torch._dynamo.reset()
    x, w, offs, dy = make([9, 0, 17, 1], N_, K_, BF16, tail=2)
    plan = _plan(x, w, wgrad_splits=2, wgrad_block_k=16)
    assert plan_from_op_fields(MoEGroupedDetPlan, plan_to_op_fields(plan)) == plan

    c = torch.randn(x.shape[0], N_, generator=torch.Generator().manual_seed(5)).to(DEV)

    def f(x, w, offs):  # linear in y: dL/dy = c exactly, whatever code inductor generates
        y = moe_grouped_det_gemm(x, w, offs, plan=plan)
        return (y.float() * c).sum()

    backend = "aot_eager" if DEV.type == "cpu" else "inductor"
    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend=backend)):
        xx, ww = (t.clone().requires_grad_() for t in (x, w))
        fn(xx, ww, offs).backward()
        outs.append((xx.grad, ww.grad))
    for a, b in zip(*outs, strict=True):
        assert bitwise_equal(a, b)
    xo, wo = x.clone().requires_grad_(), w.clone().requires_grad_()
    yo = torch.ops.cake_moe_grouped_det_gemm.fwd(xo, wo, api._row_ends(offs, None, x.shape[0]),
                                                 plan_to_op_fields(plan), None, None)
    yo.backward(dy)
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    ye = moe_grouped_det_gemm(xe, we, offs, plan=plan)
    ye.backward(dy)
    for a, b in ((yo, ye), (xo.grad, xe.grad), (wo.grad, we.grad)):
        assert bitwise_equal(a.detach(), b.detach())


@pytest.mark.parametrize("dtype,N,K,match", [
    (torch.float32, 24, 40, "needs bfloat16 inputs .*got float32"),
    (torch.float16, 24, 40, "needs bfloat16 inputs .*got float16"),
    (BF16, 20, 40, "multiples of 8 .*got N=20"),
    (BF16, 24, 36, "multiples of 8 .*got K=36"),
], ids=["fp32", "fp16", "N", "K"])
def test_route_refused_before_launch(dtype, N, K, match, monkeypatch):
    x, w, offs, dy = make([3, 0, 5], N, K, dtype, tail=1)
    plan = _plan(x, w)
    assert grouped_mm_problem(plan, dtype, x.device) is not None
    assert grouped_mm_problem(dataclasses.replace(plan, grouped_mm_fwd_dgrad=0), dtype,
                              x.device) is None

    def boom(*a, **k):
        raise AssertionError("launched for a refused plan")

    monkeypatch.setattr(torch, "_grouped_mm", boom)
    full = f"plan: grouped_mm_fwd_dgrad=1 .*{match}.*use grouped_mm_fwd_dgrad=0"
    for fn in (moe_grouped_det_gemm, moe_grouped_det_gemm_fwd):
        assert_raises_unmodified(fn, {"x": x, "weight": w, "offs": offs, "plan": plan}, full)
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=dataclasses.replace(
        plan, grouped_mm_fwd_dgrad=0))
    mg = torch.ones(w.shape, device=DEV)
    assert_raises_unmodified(moe_grouped_det_gemm_bwd,
                             {"dy": dy, "saved": saved, "plan": plan, "main_grad": mg}, full)


def test_route_problem_without_torch_grouped_mm_and_on_other_gpus(monkeypatch):
    x, w, _, _ = make([3, 5], N_, K_, BF16)
    plan = _plan(x, w)
    cuda = torch.device("cuda", 0)
    for cap, ok in (((8, 0), False), ((9, 0), True), ((10, 0), True), ((12, 0), False)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        why = grouped_mm_problem(plan, BF16, cuda)
        assert (why is None) == ok, (cap, why)
        if not ok:
            assert "compute capability 9.x or 10.x" in why and f"{cap[0]}.0" in why
    assert grouped_mm_problem(plan, BF16, torch.device("cpu")) is None  # forced: allowed
    monkeypatch.setattr(plan_mod, "grouped_mm_available", lambda: False)
    why = grouped_mm_problem(plan, BF16, torch.device("cpu"))
    assert "needs torch._grouped_mm" in why and "use grouped_mm_fwd_dgrad=0" in why
    with pytest.raises(ValueError, match="plan: grouped_mm_fwd_dgrad=1 needs torch._grouped_mm"):
        moe_grouped_det_gemm(x, w, torch.tensor([3, 8], dtype=torch.int32, device=DEV),
                             plan=plan)


def test_plan_field_format_and_upgrade():
    # the rule's plan with the route off (on an H200 the rule itself routes)
    plan = dataclasses.replace(make_plan(4096, 8, 64, 48, BF16, DEV), grouped_mm_fwd_dgrad=0)
    p = dataclasses.replace(plan, grouped_mm_fwd_dgrad=1)
    d = p.to_dict()
    assert d["grouped_mm_fwd_dgrad"] == 1 and d["version"] == 4 == MoEGroupedDetPlan.format_version
    assert MoEGroupedDetPlan.from_dict(d) == p
    assert MoEGroupedDetPlan.from_dict(json.loads(p.to_json())) == p
    assert hash(p) == hash(dataclasses.replace(plan, grouped_mm_fwd_dgrad=1)) and p != plan
    assert p.key != plan.key
    assert plan_from_op_fields(MoEGroupedDetPlan, plan_to_op_fields(p)) == p
    v2 = {k: v for k, v in plan.to_dict().items()
          if k not in ("grouped_mm_fwd_dgrad", "wgrad_order")}
    v2["version"] = 2  # a plan serialised before the field existed
    with pytest.raises(ValueError, match="format version 2 is not 4: .*add "
                       "grouped_mm_fwd_dgrad = 0 and wgrad_order = 0 and set version = 4"):
        MoEGroupedDetPlan.from_dict(v2)
    upgraded = MoEGroupedDetPlan.from_dict({**v2, "grouped_mm_fwd_dgrad": 0, "wgrad_order": 0,
                                            "version": 4})
    assert upgraded == dataclasses.replace(plan, grouped_mm_fwd_dgrad=0, wgrad_order=0)
    with pytest.raises(ValueError, match="grouped_mm_fwd_dgrad"):
        MoEGroupedDetPlan.from_dict({**v2, "wgrad_order": 0, "version": 4})  # field missing
    for bad in (2, -1, True):
        with pytest.raises(ValueError, match="grouped_mm_fwd_dgrad"):
            dataclasses.replace(plan, grouped_mm_fwd_dgrad=bad)


def test_rule_cpu_never_routes():
    for dtype in (torch.float32, BF16, torch.float16):
        for M, E, N, K in ((4096, 8, 64, 48), (0, 1, 16, 16), (100, 3, 24, 40)):
            assert make_plan(M, E, N, K, dtype, "cpu").grouped_mm_fwd_dgrad == 0


def test_rule_cuda_without_a_gpu(monkeypatch):
    """The documented CUDA rule for an H200-sized device, evaluated without a GPU (the
    rule's device reads patched): 1 only for compute capability 9.x, bf16, N and K multiples
    of 8, with torch._grouped_mm; a plan it picks passes the problem check."""
    monkeypatch.setattr(plan_mod, "sm_count", lambda device: 132)
    monkeypatch.setattr(plan_mod, "tma_available", lambda: True)
    cuda = torch.device("cuda", 0)
    for cap in ((8, 0), (9, 0), (10, 0)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        for dtype in (torch.float32, BF16, torch.float16):
            for n, k in ((3072, 4096), (4096, 1536), (100, 64), (64, 100), (24, 40)):
                p = plan_mod._rule(1 << 17, 8, n, k, dtype, cuda)
                want = cap[0] == 9 and dtype == BF16 and n % 8 == 0 and k % 8 == 0
                assert p.grouped_mm_fwd_dgrad == int(want), (cap, dtype, n, k)
                assert p.wgrad_order == 1  # every CUDA plan (H200 timing, moe.md)
                assert grouped_mm_problem(p, dtype, cuda) is None
                # the fwd/dgrad tiles stay in the plan (unused by the route)
                assert (p.block_m, p.block_n) == (128, 128)
                # wgrad: 128 x 256 tiles for the TMA kernel on 9.x / 10.x (moe.md's sweep)
                wide = p.tma == 1 and cap[0] in (9, 10)
                assert (p.wgrad_block_m, p.wgrad_block_n) == (128, 256 if wide else 128)
                assert p.tma == int(dtype != torch.float32 and n % 8 == 0 and k % 8 == 0
                                    and cap[0] >= 9), (cap, dtype, n, k)
    for cap in ((12, 0),):  # consumer Blackwell: TMA, but not the 144 KiB wgrad tile
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        p = plan_mod._rule(1 << 17, 8, 3072, 4096, BF16, cuda)
        assert p.tma == 1 and (p.wgrad_block_m, p.wgrad_block_n) == (128, 128)
    monkeypatch.setattr(plan_mod, "cuda_capability", lambda device: (9, 0))
    monkeypatch.setattr(plan_mod, "grouped_mm_available", lambda: False)  # an older torch
    assert plan_mod._rule(1 << 17, 8, 3072, 4096, BF16, cuda).grouped_mm_fwd_dgrad == 0
    if not torch.cuda.is_available():  # a CUDA rule reads the device: refused, not asserted
        with pytest.raises(ValueError, match="CUDA is not available"):
            make_plan(64, 4, 24, 40, BF16, "cuda")


@pytest.mark.skipif(DEV.type != "cuda", reason="the rule picks the route on CUDA only")
def test_cuda_rule_picks_route_and_it_repeats_bitwise():
    """On a GPU of compute capability 9.x the rule picks the route for bf16; its forward
    and dgrad repeat bit for bit over 5 runs with other GEMMs between (with rows past the
    last offset, which must come back exactly 0); the evidence the rule rests on."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the rule picks the route on compute capability 9.x only")
    E, N, K = 8, 512, 384
    sizes = [700, 0, 1, 2048, 33, 0, 900, 400]
    tail = 77
    x, w, offs, dy = make(sizes, N, K, BF16, tail, seed=21)
    M = x.shape[0]
    plan = make_plan(M, E, N, K, BF16, DEV)
    assert plan.grouped_mm_fwd_dgrad == 1

    def step():
        y, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
        dx = moe_grouped_det_gemm_bwd(dy, saved).dx
        return y, dx

    def noise():
        a = torch.randn(777, 333, device=DEV, dtype=BF16)
        (a @ a.t()).sum().item()
        torch._grouped_mm(x, w.transpose(-2, -1), offs=offs).sum().item()  # fresh garbage

    y, dx = assert_bitwise_repeat(step, repeats=5, between=noise)
    end = sum(sizes)
    assert (y[end:] == 0).all() and (dx[end:] == 0).all()
    ref = moe_grouped_gemm_reference(x.double(), w.double(), offs, dtype=torch.float64)
    assert_close_to_reference(y, ref, BF16)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compile"])
def test_routed_gemm_full_rows_skip_the_tail_zeroing(compiled, monkeypatch):
    """The layer's routed GEMM (row ends whose last one is M: every row routed) launches no
    tail zeroing in its forward or dgrad, eager or through the custom ops, with the public
    entry's bits over the same ends."""
    torch._dynamo.reset()
    x, w, offs, dy = make([9, 0, 17, 1], N_, K_, BF16, tail=0)
    plan = _plan(x, w)
    ends = api._row_ends(offs, None, x.shape[0])
    assert int(ends[-1]) == x.shape[0]
    want = []
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = moe_grouped_det_gemm(xx, ww, offs, plan=plan)
    y.backward(dy)
    want = [y.detach(), xx.grad, ww.grad]
    calls = []
    real = api._zero_tail_rows
    monkeypatch.setattr(api, "_zero_tail_rows", lambda *a: (calls.append(1), real(*a)))

    def f(x, w):
        return api.routed_gemm(x, w, ends, plan=plan)

    fn = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xx, ww)
    y.backward(dy)
    assert calls == []
    for a, b in zip([y.detach(), xx.grad, ww.grad], want, strict=True):
        assert bitwise_equal(a, b)
