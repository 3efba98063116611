"""The module, low-level fwd/bwd, plans, workspaces, main_grad, torch.compile, manifest."""

import dataclasses
import importlib

import pytest
import torch
import torch.nn.functional as F
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import (
    LMHeadLoss,
    LMHeadLossDetPlan,
    LMHeadLossDetWorkspace,
    lm_head_loss_det,
    lm_head_loss_det_bwd,
    lm_head_loss_det_fwd,
    make_plan,
)

DEV = default_device()


def _data(T=40, H=24, V=300, dtype=torch.float32, seed=0):
    h = randn((T, H), dtype, DEV, seed=seed + 1)
    w = randn((V, H), dtype, DEV, seed=seed + 2, scale=0.3)
    b = randn((V,), dtype, DEV, seed=seed + 3, scale=0.3)
    y = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(seed)).to(DEV)
    y[::5] = -100
    return h, w, b, y


@pytest.mark.parametrize("bias", [False, True])
def test_module_matches_linear_plus_cross_entropy(bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 300, bias=bias, device=DEV)
    m = LMHeadLoss(24, 300, bias=bias, label_smoothing=0.1, device=DEV)
    assert list(m.state_dict()) == list(lin.state_dict())
    m.load_state_dict(lin.state_dict())
    h, _, _, y = _data()
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    loss = m(h1, y)
    ref = F.cross_entropy(lin(h2).float(), y, label_smoothing=0.1)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(m.weight.grad, lin.weight.grad, rtol=1e-4, atol=1e-6)
    if bias:
        torch.testing.assert_close(m.bias.grad, lin.bias.grad, rtol=1e-4, atol=1e-6)
    assert "vocab_size=300" in repr(m)
    m32 = LMHeadLoss(24, 300, bias=bias, device=DEV)  # fp32 weights, bf16 activations
    hb = h.bfloat16().requires_grad_()
    m32(hb, y).backward()
    assert m32.weight.grad.dtype == torch.float32 and hb.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph_same_values(reduction):
    torch._dynamo.reset()
    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 24, device=DEV)
    head = LMHeadLoss(24, 200, bias=True, reduction=reduction, z_loss=1e-3, device=DEV)
    params = list(proj.parameters()) + list(head.parameters())

    def f(x, y):
        return head(torch.tanh(proj(x)), y).sum()

    x = randn((30, 16), torch.float32, DEV, seed=3)
    _, _, _, y = _data(T=30, V=200)
    f(x, y).backward()
    g_eager = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    compiled = torch.compile(f, fullgraph=True,
                             backend="aot_eager" if DEV.type == "cpu" else "inductor")
    loss = compiled(x, y)
    loss.backward()
    torch.testing.assert_close(loss, f(x, y), rtol=1e-6, atol=1e-6)
    for a, p in zip(g_eager, params, strict=True):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("gif", [1, 0])
def test_low_level_matches_autograd_bitwise(gif):
    h, w, b, y = _data(dtype=torch.bfloat16)
    plan = dataclasses.replace(make_plan(24, 300, torch.bfloat16, DEV), chunk_tokens=16,
                               grad_in_forward=gif)
    (loss, lse), saved = lm_head_loss_det_fwd(h, w, y, bias=b, plan=plan, z_loss=1e-3)
    assert saved.grad_in_forward == bool(gif)
    g = lm_head_loss_det_bwd(torch.tensor(1.5, device=DEV), saved)
    hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
    loss2, lse2 = lm_head_loss_det(hh, ww, y, bias=bb, plan=plan, z_loss=1e-3, return_lse=True)
    loss2.backward(torch.tensor(1.5, device=DEV))
    assert bitwise_equal(loss, loss2) and bitwise_equal(lse, lse2)
    assert bitwise_equal(g.dhidden, hh.grad) and bitwise_equal(g.dweight, ww.grad)
    assert bitwise_equal(g.dbias, bb.grad)


def test_recompute_and_grad_in_forward_agree():
    h, w, b, y = _data()
    outs = []
    for gif in (1, 0):
        plan = dataclasses.replace(make_plan(24, 300, torch.float32, DEV),
                                   grad_in_forward=gif)
        hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
        lm_head_loss_det(hh, ww, y, bias=bb, plan=plan).backward(torch.tensor(0.3))
        outs.append((hh.grad, ww.grad, bb.grad))
    for a, c in zip(*outs, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("gif", [1, 0])
def test_main_grad_is_start_plus_fp32_dweight(gif):
    """The chunked route (defer_dw_tokens=0): one fp32 sum, added once or cast once."""
    h, w, b, y = _data(dtype=torch.bfloat16)
    plan = dataclasses.replace(make_plan(24, 300, torch.bfloat16, DEV), chunk_tokens=16,
                               grad_in_forward=gif, defer_dw_tokens=0)
    start = randn((300, 24), torch.float32, DEV, seed=9)
    main_grad = start.clone()
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    lm_head_loss_det(hh, ww, y, plan=plan, main_grad=main_grad).backward()
    assert ww.grad is None
    zero = torch.zeros_like(start)
    lm_head_loss_det(h, w.clone().requires_grad_(), y, plan=plan, main_grad=zero).backward()
    assert torch.equal(main_grad, start + zero)  # the fp32 ordered sum, added once
    ww2 = w.clone().requires_grad_()
    lm_head_loss_det(h, ww2, y, plan=plan).backward()
    assert torch.equal(ww2.grad, zero.to(torch.bfloat16))  # the same sum, cast once


def test_deferred_dweight_route():
    """16-bit, T <= defer_dw_tokens: dweight from the kept dlogits in one GEMM, scaled by the
    upstream gradient in the kernel; it agrees with the chunked fp32 sum to bf16 rounding,
    and with main_grad it adds g * (dlogitsᵀ · hidden) into the start values."""
    h, w, b, y = _data(dtype=torch.bfloat16)
    T = h.shape[0]
    base = dataclasses.replace(make_plan(24, 300, torch.bfloat16, DEV), chunk_tokens=16)
    assert base.defer_dw_tokens == 48 >= T
    grads = {}
    for name, defer in (("deferred", T), ("chunked", 0)):
        plan = dataclasses.replace(base, defer_dw_tokens=defer)
        hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
        lm_head_loss_det(hh, ww, y, bias=bb, plan=plan).backward(torch.tensor(0.7))
        grads[name] = (hh.grad, ww.grad, bb.grad)
    torch.testing.assert_close(grads["deferred"][1].float(), grads["chunked"][1].float(),
                               rtol=2e-2, atol=2e-4)
    # dhidden and dbias come from the same kernels on both routes
    assert bitwise_equal(grads["deferred"][0], grads["chunked"][0])
    assert bitwise_equal(grads["deferred"][2], grads["chunked"][2])
    start = randn((300, 24), torch.float32, DEV, seed=9)
    mg = start.clone()
    lm_head_loss_det(h, w.clone().requires_grad_(), y, plan=base, main_grad=mg).backward()
    zero = torch.zeros_like(start)
    lm_head_loss_det(h, w.clone().requires_grad_(), y, plan=base, main_grad=zero).backward()
    assert torch.equal(mg, start + zero)


def test_explicit_plan_workspace_reuse_and_no_grad():
    h, w, b, y = _data(dtype=torch.bfloat16)
    plan = dataclasses.replace(make_plan(24, 300, torch.bfloat16, DEV), chunk_tokens=16,
                               dh_split=2)
    ws = LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.bfloat16)
    assert set(ws.names) == {"logits", "dlogits", "dh_partials"}
    grads = []
    for workspace in (ws, None, ws):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        lm_head_loss_det(hh, ww, y, plan=plan, workspace=workspace).backward()
        grads.append((hh.grad, ww.grad))
    for a, c in zip(grads[0] + grads[2], grads[1] * 2, strict=True):
        assert bitwise_equal(a, c)
    with torch.no_grad():
        l_ng = lm_head_loss_det(h, w, y, plan=plan)
    assert bitwise_equal(l_ng, lm_head_loss_det(h, w, y, plan=plan))
    only_h = h.clone().requires_grad_()
    lm_head_loss_det(only_h, w, y, plan=plan).backward()  # weight needs no gradient
    assert bitwise_equal(only_h.grad, grads[0][0])


def test_check_labels_flag_and_3d_lse():
    h, w, _, y = _data()
    plan = make_plan(24, 300, torch.float32, DEV)
    bad = y.clone()
    bad[3] = 300
    with pytest.raises(ValueError, match=r"labels: values must be in \[0, 300\)"):
        lm_head_loss_det(h, w, bad, plan=plan)
    loss = lm_head_loss_det(h, w, bad, plan=dataclasses.replace(plan, check_labels=0))
    assert loss.shape == () and torch.isnan(loss)  # unchecked: NaN, no error, no bad access
    loss, lse = lm_head_loss_det(h.reshape(4, 10, 24), w, y.reshape(4, 10), reduction="none",
                                 return_lse=True)
    assert loss.shape == lse.shape == (4, 10) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.reshape(-1), torch.logsumexp(h @ w.T, -1), rtol=1e-5,
                               atol=1e-5)


def test_plan_rules_and_roundtrip():
    p = make_plan(4096, 128256, torch.bfloat16, "cuda")
    # CUDA: no host read of the labels (no sync); the CPU rule checks them
    assert p.chunk_tokens == 1280 and p.grad_in_forward == 1 and p.check_labels == 0
    assert make_plan(64, 300, torch.float32, "cpu").check_labels == 1
    assert p.cublas_gemms == 1 and (p.dw_block_m, p.dw_block_n) == (128, 256)
    assert make_plan(4096, 32000, torch.bfloat16, "cuda").chunk_tokens == 2048
    assert make_plan(512, 32000, torch.bfloat16, "cuda").chunk_tokens == 2048  # the floor
    assert make_plan(4096, 151936, torch.bfloat16, "cuda").chunk_tokens == 1280
    assert make_plan(4096, 151936, torch.float32, "cuda").cublas_gemms == 0
    for bad in (torch.float64, torch.int64, "bf16"):
        with pytest.raises(ValueError, match="dtype"):
            make_plan(4096, 151936, bad, "cuda")
    assert make_plan(64, 100, torch.bfloat16, "cpu").cublas_gemms == 0
    assert make_plan(64, 100, torch.float32, DEV, reduction="none").grad_in_forward == 0
    assert make_plan(24, 300, torch.float32, DEV) is make_plan(24, 300, torch.float32,
                                                                   DEV)
    assert LMHeadLossDetPlan.from_dict(p.to_dict()) == p
    for bad in (dict(hidden_size=0), dict(vocab_size=True), dict(vocab_size=2**23)):
        args = dict(hidden_size=8, vocab_size=8) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_plan(**args, dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError, match="reduction"):
        make_plan(8, 8, torch.float32, DEV, reduction="avg")
    good = p.to_dict()
    for field, v in (("chunk_tokens", 0), ("block_v", 3), ("dw_block_k", 8),
                     ("grad_in_forward", 2), ("num_warps", 3), ("hidden_size", 8.0),
                     ("cublas_gemms", 2), ("defer_dw_tokens", -1)):
        with pytest.raises(ValueError, match=field):
            LMHeadLossDetPlan.from_dict({**good, field: v})


@pytest.mark.parametrize("main", [False, True])
def test_eager_inplace_scaling_same_bits_and_second_backward_refused(main):
    """The eager backward scales the kept dhidden / fp32 dW32 in place (chunked route):
    the same bits as the low-level backward's scaled copies, and a second backward through
    the same graph is refused by autograd's version check instead of scaling twice."""
    h, w, b, y = _data(dtype=torch.bfloat16)
    plan = dataclasses.replace(make_plan(24, 300, torch.bfloat16, DEV), chunk_tokens=16,
                               grad_in_forward=1, defer_dw_tokens=0)
    start = randn((300, 24), torch.float32, DEV, seed=9)
    mg = start.clone() if main else None
    (loss, _), saved = lm_head_loss_det_fwd(h, w, y, bias=b, plan=plan)
    up = torch.tensor(0.7, device=DEV)
    g = lm_head_loss_det_bwd(up, saved, main_grad=mg)
    hh, ww, bb = (t.clone().requires_grad_() for t in (h, w, b))
    mg2 = start.clone() if main else None
    loss2 = lm_head_loss_det(hh, ww, y, bias=bb, plan=plan, main_grad=mg2)
    loss2.backward(up, retain_graph=True)
    assert bitwise_equal(loss, loss2) and bitwise_equal(g.dhidden, hh.grad)
    assert bitwise_equal(g.dbias, bb.grad)
    if main:
        assert ww.grad is None and bitwise_equal(mg, mg2)
    else:
        assert bitwise_equal(g.dweight, ww.grad)
    with pytest.raises(RuntimeError, match="second backward|modified by an inplace operation"):
        loss2.backward(up)


def test_strided_and_expanded_labels_read_right():
    """labels views whose flat view is not unit-stride (a column of a wider tensor, an
    expanded scalar) give the bits of their contiguous copy."""
    h, w, b, y = _data()
    wide = torch.stack([torch.zeros_like(y), y], dim=1)[:, 1]  # stride (2,)
    const = torch.full((1,), 7, dtype=torch.int64, device=DEV).expand(h.shape[0])  # stride 0
    for lab in (wide, const):
        assert not lab.is_contiguous()
        for red in ("none", "mean"):
            a = lm_head_loss_det(h, w, lab, bias=b, reduction=red)
            c = lm_head_loss_det(h, w, lab.contiguous(), bias=b, reduction=red)
            assert bitwise_equal(a, c), red


def test_second_backward_refused_under_saved_tensor_hooks():
    """save_on_cpu / identity hooks bypass autograd's version check: the eager backward
    refuses a second pass itself instead of scaling the kept gradients twice."""
    h, w, _, y = _data()
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = lm_head_loss_det(hh, ww, y) * 0.5
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_double_backward_through_a_constant_upstream_gradient_raises():
    """y.sum()'s upstream gradient needs no grad: the gradient must still refuse a second
    differentiation instead of silently dropping the penalty term."""
    h, w, _, y = _data()
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    out = lm_head_loss_det(hh, ww, y, reduction="none").sum()
    (g,) = torch.autograd.grad(out, hh, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (out + g.pow(2).sum()).backward()


def test_torch_compile_dynamic_shapes_same_bits():
    """dynamic=True makes the float options SymFloats: the input checks must trace."""
    torch._dynamo.reset()
    f = torch.compile(lambda h, w, y: lm_head_loss_det(h, w, y, label_smoothing=0.1),
                      fullgraph=True, dynamic=True,
                      backend="aot_eager" if DEV.type == "cpu" else "inductor")
    for T in (20, 33):
        h, w, _, y = _data(T=T, seed=T)
        assert bitwise_equal(f(h, w, y), lm_head_loss_det(h, w, y, label_smoothing=0.1))


def test_torch_compile_with_a_workspace_and_no_plan():
    """The workspace check compares plans by equality: a plan made while tracing (its key
    not cached, whose lock dynamo cannot enter) passes it."""
    torch._dynamo.reset()
    plan = make_plan(24, 300, torch.float32, DEV)
    ws = LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.float32)
    h, w, _, y = _data()
    f = torch.compile(lambda h, w, y: lm_head_loss_det(h, w, y, workspace=ws), fullgraph=True,
                      backend="aot_eager" if DEV.type == "cpu" else "inductor")
    assert bitwise_equal(f(h, w, y), lm_head_loss_det(h, w, y, workspace=ws))


def test_double_backward_refused_not_silent():
    h, w, _, y = _data()
    hh = h.clone().requires_grad_()
    (g,) = torch.autograd.grad(lm_head_loss_det(hh, w, y), hh, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice|grad_fn"):
        g.pow(2).sum().backward()


def test_manifest():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name
    from cake_lm_head_loss_det_train.cake_build import manifest

    m = manifest()
    assert validate_manifest(m) == [] and check_name(m["name"]) == []
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])


@pytest.mark.parametrize("gif,reduction", [(1, "mean"), (0, "none")])
def test_torch_compile_main_grad_workspace_bitwise(gif, reduction):
    """The custom-op route gives the eager route's bits, main_grad and workspace included."""
    T, H, V = 30, 24, 200
    plan = dataclasses.replace(make_plan(H, V, torch.bfloat16, DEV, reduction=reduction),
                               chunk_tokens=8, grad_in_forward=gif)
    ws = LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.bfloat16)
    h = randn((T, H), torch.bfloat16, DEV, seed=1).requires_grad_()
    w = randn((V, H), torch.bfloat16, DEV, seed=2).requires_grad_()
    b = randn((V,), torch.float32, DEV, seed=3).requires_grad_()
    y = (torch.arange(T) * 7 % V).to(DEV)

    def f(h, w, b, mg):
        return lm_head_loss_det(h, w, y, bias=b, plan=plan, workspace=ws, main_grad=mg,
                                reduction=reduction, logit_softcap=5.0).sum()

    res = []
    for comp in (False, True):
        torch._dynamo.reset()
        mg = torch.zeros(V, H, device=DEV)
        fn = torch.compile(f, fullgraph=True, backend="aot_eager" if DEV.type == "cpu"
                           else "inductor") if comp else f
        h.grad = b.grad = None
        loss = fn(h, w, b, mg)
        loss.backward()
        assert w.grad is None
        res.append((loss.detach(), h.grad, b.grad, mg))
    for a, c in zip(*res, strict=True):
        assert bitwise_equal(a, c)


def test_scaled_rows_same_bits_as_one_shot():
    """The row-blocked scaling of forward-computed dweight equals the one-shot expression."""
    from cake_lm_head_loss_det_train.api import _scaled_rows

    src = randn((10, 7), torch.float32, DEV, seed=1)
    g = torch.tensor(0.37, device=DEV)
    out = _scaled_rows(src, g, torch.empty(10, 7, dtype=torch.bfloat16, device=DEV),
                       accumulate=False, rows_per_step=3)
    assert bitwise_equal(out, (src * g).to(torch.bfloat16))
    acc = randn((10, 7), torch.float32, DEV, seed=2)
    want = acc + src * g
    _scaled_rows(src, g, acc, accumulate=True, rows_per_step=4)
    assert bitwise_equal(acc, want)


@pytest.mark.parametrize("gif", [1, 0])
@pytest.mark.parametrize("wanted", ["weight", "bias", "hidden"])
def test_partial_requires_grad(gif, wanted):
    """Only the inputs that require grad get one, and it equals the full run's."""
    h, w, b, y = _data()
    plan = dataclasses.replace(make_plan(24, 300, torch.float32, DEV), chunk_tokens=16,
                               grad_in_forward=gif)
    full = [t.clone().requires_grad_() for t in (h, w, b)]
    lm_head_loss_det(full[0], full[1], y, bias=full[2], plan=plan).backward()
    part = [t.clone().requires_grad_(n == wanted) for t, n in
            zip((h, w, b), ("hidden", "weight", "bias"), strict=True)]
    lm_head_loss_det(part[0], part[1], y, bias=part[2], plan=plan).backward()
    for f, p, n in zip(full, part, ("hidden", "weight", "bias"), strict=True):
        assert (p.grad is not None) == (n == wanted)
        if n == wanted:
            assert bitwise_equal(p.grad, f.grad)


def test_unchecked_out_of_range_label_poisons_only_its_row():
    """check_labels = 0 (the CUDA rule): a label outside [0, V) other than ignore_index
    gives its own row NaN loss and NaN dhidden; every other row keeps the checked plan's bits
    (the label is compared, never used as an address)."""
    h, w, _, y = _data()
    V = w.shape[0]
    plan = dataclasses.replace(make_plan(24, V, torch.float32, DEV, reduction="none"),
                               check_labels=0, grad_in_forward=0)
    bad = y.clone()
    bad[3], bad[7], bad[9] = V, -5, -100  # two out of range, one ignored
    ok = bad.clone()
    ok[3] = ok[7] = 0
    outs = []
    for labels in (bad, ok):
        hh = h.clone().requires_grad_()
        loss = lm_head_loss_det(hh, w, labels, reduction="none", plan=plan)
        loss.backward(torch.ones_like(loss))
        outs.append((loss.detach(), hh.grad))
    (lb, gb), (lo, go) = outs
    poisoned = torch.zeros_like(lb, dtype=torch.bool)
    poisoned[[3, 7]] = True
    assert torch.isnan(lb[poisoned]).all() and torch.isnan(gb[poisoned]).all()
    assert bitwise_equal(lb[~poisoned], lo[~poisoned])
    assert bitwise_equal(gb[~poisoned], go[~poisoned])
    mplan = dataclasses.replace(make_plan(24, V, torch.float32, DEV), check_labels=0)
    hh = h.clone().requires_grad_()
    loss = lm_head_loss_det(hh, w, bad, plan=mplan)  # "mean", gradients in the forward
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(hh.grad[3]).all()
