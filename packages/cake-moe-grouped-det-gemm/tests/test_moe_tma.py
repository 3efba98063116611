"""The TMA kernels (plan field ``tma = 1``) under the interpreter: forward, dgrad and wgrad
against float64 references on ragged groups, splits, main_grad, repeatability, closeness to
``tma = 0``, refusals before launch, copies of layouts TMA cannot read, plan format."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _moe_cases import DEV, make
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetPlan,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_bwd,
    moe_grouped_det_gemm_fwd,
)
from cake_moe_grouped_det_gemm.plan import tma_problem

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _plan(M, E, N, K, dtype, *, tma=1, splits=1, tile=16, rows=16):
    return dataclasses.replace(
        make_plan(M, E, N, K, dtype, DEV), block_m=rows, block_n=tile, block_k=tile,
        wgrad_block_m=tile, wgrad_block_n=tile, wgrad_block_k=rows, wgrad_splits=splits,
        tma=tma)


def _reference(x, w, sizes, dy):
    """float64 y, dx, dW (rows of no expert: 0; empty expert: 0)."""
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64, device=x.device)
    dx = torch.zeros_like(x64)
    dw = torch.zeros_like(w64)
    lo = 0
    for e, n in enumerate(sizes):
        r = slice(lo, lo + n)
        y[r] = x64[r] @ w64[e].T
        dx[r] = dy64[r] @ w64[e]
        dw[e] = dy64[r].T @ x64[r]
        lo += n
    return y, dx, dw


def _run(x, w, offs, dy, plan, main_grad=None):
    y, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    g = moe_grouped_det_gemm_bwd(dy, saved, main_grad=main_grad)
    return y, g.dx, g.dweight


def _close(got, ref, dtype):
    err = (got.double() - ref).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, ref.abs().max().item()), err


# sizes per expert, rows past the last offset, N, K: empty experts, one-row experts, all
# rows on one expert, M not a multiple of the tiles, N / K multiples of 8 but not of 16
CASES = [
    ([5, 0, 1, 19], 3, 24, 40),
    ([0, 23, 0], 0, 40, 24),
    ([1, 1, 0, 33], 5, 16, 56),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_tma_reference_repeat_and_pointer(dtype, case):
    sizes, tail, N, K = CASES[case]
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=dtype, tail=tail, seed=case)
    M, E = x.shape[0], len(sizes)
    ref = _reference(x, w, sizes, dy)
    for splits in (1, 3):
        plan = _plan(M, E, N, K, dtype, splits=splits)
        got = _run(x, w, offs, dy, plan)
        for g, r in zip(got, ref, strict=True):
            assert g.dtype == dtype
            _close(g, r, dtype)
        again = _run(x, w, offs, dy, plan)
        assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True))  # bitwise repeat
        ptr = _run(x, w, offs, dy, dataclasses.replace(plan, tma=0))
        # close to the pointer kernels (bits not promised equal)
        for g, p in zip(got, ptr, strict=True):
            _close(g, p.double(), dtype)
        assert torch.equal(got[0][sum(sizes):], torch.zeros_like(got[0][sum(sizes):]))
        assert torch.equal(got[1][sum(sizes):], torch.zeros_like(got[1][sum(sizes):]))
        for e, n in enumerate(sizes):
            if n == 0:
                assert torch.equal(got[2][e], torch.zeros_like(got[2][e]))


@pytest.mark.parametrize("splits", [1, 2])
def test_tma_main_grad_accumulate(splits):
    sizes, N, K = [7, 0, 12, 2], 24, 32
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=torch.bfloat16, tail=2, seed=7)
    plan = _plan(x.shape[0], len(sizes), N, K, torch.bfloat16, splits=splits)
    base = torch.randn(w.shape, generator=torch.Generator().manual_seed(3)).to(DEV)
    mg = base.clone()
    y, dx, dw = _run(x, w, offs, dy, plan, main_grad=mg)
    assert dw is None
    ref = _reference(x, w, sizes, dy)[2]
    _close(mg - base, ref, torch.bfloat16)
    mg2 = base.clone()
    _run(x, w, offs, dy, plan, main_grad=mg2)
    assert torch.equal(mg, mg2)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_tma_other_rows_contribute_exact_zeros():
    """Rows of no expert (past the last offset) hold inf / NaN: the forward tiles and the
    wgrad's last partial step read them and must drop them exactly."""
    sizes, tail, N, K = [6, 0, 11], 9, 16, 24
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=torch.float32, tail=tail, seed=2)
    m = sum(sizes)
    x[m:] = float("inf")
    dy[m:] = float("nan")
    plan = _plan(x.shape[0], len(sizes), N, K, torch.float32, splits=2)
    got = _run(x, w, offs, dy, plan)
    assert all(bool(torch.isfinite(g).all()) for g in got)
    ref = _reference(x[:m], w, sizes, dy[:m])
    for g, r in zip(got, ref, strict=True):
        _close(g[:m] if g.shape[0] == x.shape[0] else g, r, torch.float32)


def test_tma_autograd_entry():
    sizes, N, K = [4, 9, 0], 16, 24
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=torch.float32, tail=1, seed=5)
    plan = _plan(x.shape[0], len(sizes), N, K, torch.float32, splits=2)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = moe_grouped_det_gemm(xr, wr, offs, plan=plan)
    y.backward(dy)
    ref = _reference(x, w, sizes, dy)
    for g, r in zip((y.detach(), xr.grad, wr.grad), ref, strict=True):
        _close(g, r, torch.float32)


def test_tma_copies_layouts_it_cannot_read():
    """Views with a non-unit last stride or an unaligned start are copied contiguous first:
    the same bits as the contiguous inputs."""
    sizes, N, K = [5, 8, 0, 3], 24, 32
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=torch.bfloat16, tail=2, seed=9)
    plan = _plan(x.shape[0], len(sizes), N, K, torch.bfloat16, splits=2)
    want = _run(x, w, offs, dy, plan)
    xs = torch.zeros(x.shape[0], K + 1, dtype=x.dtype, device=DEV)
    xs[:, 1:] = x
    xs = xs[:, 1:]  # unaligned start, row stride K + 1
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)  # last stride N, not 1
    dyt = dy.t().contiguous().t()  # column-major
    before = [t.clone() for t in (xs, wt, dyt)]
    got = _run(xs, wt, offs, dyt, plan)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(a, b) for a, b in zip((xs, wt, dyt), before, strict=True))
    # contiguous views at an unaligned start (2 bytes in): contiguous() would return them
    # as is, and a TMA descriptor refuses an unaligned base; they are copied instead
    flat = torch.zeros(x.numel() + dy.numel() + w.numel() + 3, dtype=x.dtype, device=DEV)
    xu = flat[1:1 + x.numel()].view_as(x)
    dyu = flat[2 + x.numel():2 + x.numel() + dy.numel()].view_as(dy)
    wu = flat[3 + x.numel() + dy.numel():].view_as(w)
    for u, t in ((xu, x), (dyu, dy), (wu, w)):
        u.copy_(t)
        assert u.is_contiguous() and u.data_ptr() % 16 != 0
    got = _run(xu, wu, offs, dyu, plan)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype,N,K", [(torch.bfloat16, 12, 16), (torch.bfloat16, 16, 20),
                                       (torch.float32, 6, 8)])
def test_tma_refuses_unaligned_before_launch(dtype, N, K):
    sizes = [3, 4]
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=dtype)
    plan = _plan(x.shape[0], 2, N, K, dtype)
    assert tma_problem(plan, dtype) is not None
    assert tma_problem(dataclasses.replace(plan, tma=0), dtype) is None
    before = [t.clone() for t in (x, w, offs)]
    with pytest.raises(ValueError, match="tma=1 needs out_features N and in_features K"):
        moe_grouped_det_gemm_fwd(x, w, offs, plan=plan)
    with pytest.raises(ValueError, match="tma=1 needs"):
        moe_grouped_det_gemm(x, w, offs, plan=plan)
    _, saved = moe_grouped_det_gemm_fwd(x, w, offs, plan=dataclasses.replace(plan, tma=0))
    mg = torch.ones(w.shape, device=DEV)
    with pytest.raises(ValueError, match="tma=1 needs"):
        moe_grouped_det_gemm_bwd(dy, saved, plan=plan, main_grad=mg)
    assert torch.equal(mg, torch.ones_like(mg))
    assert all(torch.equal(a, b) for a, b in zip((x, w, offs), before, strict=True))


def test_tma_plan_fields_rule_and_format(monkeypatch):
    plan = make_plan(64, 4, 24, 40, torch.bfloat16, DEV)
    assert plan.tma == int(torch.device(DEV).type == "cuda"
                           and torch.cuda.get_device_capability()[0] >= 9)
    t = dataclasses.replace(plan, tma=1)
    d = t.to_dict()
    assert d["tma"] == 1 and d["version"] == 4
    assert MoEGroupedDetPlan.from_dict(d) == t
    old = {k: v for k, v in plan.to_dict().items()
           if k not in ("tma", "grouped_mm_fwd_dgrad", "wgrad_order")}
    old["version"] = 1  # a plan serialised before the field existed
    with pytest.raises(ValueError, match="format version 1 .*add tma = 0"):
        MoEGroupedDetPlan.from_dict(old)
    with pytest.raises(ValueError, match="tma"):
        MoEGroupedDetPlan.from_dict({**old, "version": 4})  # missing fields
    assert MoEGroupedDetPlan.from_dict({**old, "version": 4, "tma": 0,
                                        "grouped_mm_fwd_dgrad": 0, "wgrad_order": 0}) == \
        dataclasses.replace(plan, tma=0, grouped_mm_fwd_dgrad=0, wgrad_order=0)
    with pytest.raises(ValueError, match="tma must be 0 or 1"):
        dataclasses.replace(plan, tma=2)
    with pytest.raises(ValueError, match="<= 256"):
        dataclasses.replace(plan, tma=1, block_n=512)
    dataclasses.replace(plan, tma=0, block_n=512)  # the pointer kernels take any tile
    import cake_moe_grouped_det_gemm.plan as plan_mod

    monkeypatch.setattr(plan_mod, "sm_count", lambda device: 132)  # an H200, no GPU needed
    cuda = torch.device("cuda")
    for cap in ((8, 0), (9, 0)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for n, k in ((4096, 2048), (100, 64), (64, 100)):
                p = plan_mod._rule(1 << 16, 8, n, k, dtype, cuda)  # the rule, no launch
                want = cap >= (9, 0) and dtype != torch.float32 and n % 8 == 0 and k % 8 == 0
                assert p.tma == int(want), (cap, dtype, n, k)
                assert tma_problem(p, dtype) is None
    if not torch.cuda.is_available():  # a CUDA rule reads the device: refused, not asserted
        with pytest.raises(ValueError, match="CUDA is not available"):
            make_plan(64, 4, 24, 40, torch.bfloat16, "cuda")
    monkeypatch.setattr(plan_mod, "tma_available", lambda: False)  # Triton < 3.4
    p = plan_mod._rule(1 << 16, 8, 4096, 2048, torch.bfloat16, cuda)
    assert p.tma == 0
    assert "Triton >= 3.4" in tma_problem(dataclasses.replace(p, tma=1), torch.bfloat16)


def test_tma_compile_fullgraph_same_bits():
    """Under torch.compile the plan (tma included) crosses the custom ops as ints; the TMA
    descriptors are built inside the ops: the eager bits."""
    torch._dynamo.reset()
    sizes, N, K = [9, 0, 17, 1], 16, 24
    x, w, offs, dy = make(sizes, N=N, K=K, dtype=torch.float32, tail=2)
    plan = _plan(x.shape[0], len(sizes), N, K, torch.float32, splits=1)

    def f(x, w, offs):
        y = moe_grouped_det_gemm(x, w, offs, plan=plan)
        return (y * torch.cos(y)).sum()

    backend = "aot_eager" if DEV.type == "cpu" else "inductor"
    outs = []
    for fn in (f, torch.compile(f, fullgraph=True, backend=backend)):
        xx, ww = (t.clone().requires_grad_() for t in (x, w))
        fn(xx, ww, offs).backward()
        outs.append((xx.grad, ww.grad))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
