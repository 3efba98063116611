"""The entries agree bit for bit: batched and packed forms, flash-attn's two entries, the
low-level pair and autograd, with and without a workspace, checkpointed, compiled,
non-contiguous inputs; outputs fully written; lse layouts; gradients only where asked;
zero tokens; double backward refused."""

import pytest
import torch
import torch.utils.checkpoint
from _gqa_cases import DEV, GRADS, graph_code, lens_to_cu, make, poisoned_launch_buffers, run
from cake_core.testing import (
    assert_compiles_to_op,
    bitwise_equal,
    leaf_grads,
    randn,
)
from cake_gqa_det_train import (
    GQADetWorkspace,
    flash_attn_func,
    flash_attn_varlen_func,
    gqa_det,
    gqa_det_bwd,
    gqa_det_fwd,
    make_plan,
)

NAMES = ("out", "dq", "dk", "dv")


def _args(case):
    args = (case["q"], case["k"], case["v"])
    if case["cu_q"] is not None:
        args += (case["cu_q"], case["cu_k"])
    return args


def _grads(fn, case, *args, **kw):
    """``[out, dq, dk, dv]`` of ``fn(q, k, v, *args, **kw)`` for the upstream ``do``."""
    q, k, v = (case[n].detach().clone().requires_grad_() for n in "qkv")
    out = fn(q, k, v, *args, **kw)
    out.backward(case["do"])
    return [out.detach(), q.grad, k.grad, v.grad]


def _assert_same(got, want, names=NAMES, what="differs"):
    for n, a, b in zip(names, got, want, strict=True):
        assert a is not None and b is not None, n
        assert bool(torch.isfinite(a).all()), f"{n}: not finite"
        assert bitwise_equal(a, b), f"{n}: {what}"


# ----------------------------------------------------------------------------- lse layout


def test_lse_layout_packed_and_batched():
    for dtype in (torch.float32, torch.bfloat16):
        c = make(lens_q=[3, 0, 40], lens_k=[5, 2, 40], Hq=4, Hkv=1, dtype=dtype, seed=1)
        out, lse = gqa_det(*_args(c), return_lse=True)
        assert out.shape == c["q"].shape and out.dtype == dtype
        assert lse.shape == (4, 43) and lse.dtype == torch.float32
        assert not lse.requires_grad
        c = make(B=3, Sq=9, Sk=17, Hq=4, Hkv=2, dtype=dtype, seed=2)
        out, lse = gqa_det(*_args(c), return_lse=True)
        assert out.shape == (3, 9, 4, 64) and out.dtype == dtype
        assert lse.shape == (3, 4, 9) and lse.dtype == torch.float32
        assert bool(torch.isfinite(lse).all())
    # without return_lse: the output alone
    assert isinstance(gqa_det(*_args(c)), torch.Tensor)


def test_rows_without_keys_give_zero_and_minus_inf():
    """Under causal with more queries than keys, the first Lq - Lk rows see no key."""
    c = make(B=2, Sq=12, Sk=5, Hq=2, Hkv=1, seed=3)
    q = c["q"].clone().requires_grad_()
    out, lse = gqa_det(q, c["k"], c["v"], return_lse=True)
    out.backward(c["do"])
    assert bool((out[:, :7] == 0).all()) and bool((lse[:, :, :7] == float("-inf")).all())
    assert bool(torch.isfinite(lse[:, :, 7:]).all())
    assert bool((q.grad[:, :7] == 0).all())


@pytest.mark.parametrize("Sq,Sk,kw", [(40, 40, {}), (20, 50, {"window_size": (7, 0)}),
                                      (50, 20, {"causal": False, "softcap": 3.0})])
def test_batch_is_packed_with_uniform_lengths(Sq, Sk, kw):
    """The batched form gives the bits of the same documents packed: out, lse, grads."""
    B, Hq, Hkv, D = 2, 4, 2, 64
    c = make(B=B, Sq=Sq, Sk=Sk, Hq=Hq, Hkv=Hkv, seed=Sq + Sk)
    got = run(gqa_det, c, **kw)
    p = {"q": c["q"].reshape(B * Sq, Hq, D), "k": c["k"].reshape(B * Sk, Hkv, D),
         "v": c["v"].reshape(B * Sk, Hkv, D), "do": c["do"].reshape(B * Sq, Hq, D),
         "cu_q": lens_to_cu([Sq] * B), "cu_k": lens_to_cu([Sk] * B, torch.int64)}
    want = run(gqa_det, p, **kw)
    assert want["lse"].shape == (Hq, B * Sq)
    want["lse"] = want["lse"].reshape(Hq, B, Sq).permute(1, 0, 2)
    for n in GRADS:
        assert bitwise_equal(got[n].reshape(want[n].shape), want[n]), n


# ----------------------------------------------------------------------------- flash-attn


@pytest.mark.parametrize("kw", [{}, {"causal": True, "deterministic": True},
                                {"causal": True, "window_size": (9, 0), "softcap": 2.0,
                                 "softmax_scale": 0.2},
                                {"window_size": (4, 6), "deterministic": False}])
def test_flash_attn_func_same_bits_as_gqa_det(kw):
    c = make(B=2, Sq=37, Sk=45, Hq=4, Hkv=2, seed=7)
    got = _grads(flash_attn_func, c, dropout_p=0.0, alibi_slopes=None,
                 return_attn_probs=False, **kw)
    kw = {n: v for n, v in kw.items() if n != "deterministic"}
    want = _grads(gqa_det, c, **dict({"causal": False}, **kw))  # flash-attn: not causal
    _assert_same(got, want)


def test_flash_attn_func_positional_order():
    """flash-attn 2's positional order: dropout_p, softmax_scale, causal, window_size,
    softcap, alibi_slopes, deterministic, return_attn_probs."""
    c = make(B=1, Sq=30, Hq=2, Hkv=1, seed=8)
    got = flash_attn_func(c["q"], c["k"], c["v"], 0.0, 0.25, True, (5, 0), 1.5, None, True,
                          False)
    want = gqa_det(c["q"], c["k"], c["v"], softmax_scale=0.25, causal=True,
                   window_size=(5, 0), softcap=1.5)
    assert bitwise_equal(got, want)


@pytest.mark.parametrize("kw", [{}, {"causal": True, "deterministic": True},
                                {"causal": True, "window_size": (3, 0), "softcap": 1.0}])
def test_flash_attn_varlen_func_same_bits_as_gqa_det(kw):
    c = make(lens_q=[0, 33, 1, 20], lens_k=[3, 40, 2, 0], Hq=4, Hkv=2, seed=9)
    cu_q, cu_k = c["cu_q"], c["cu_k"]
    got = _grads(flash_attn_varlen_func, c, cu_q, cu_k, 33, 40, **kw)
    kw = {n: v for n, v in kw.items() if n != "deterministic"}
    want = _grads(gqa_det, c, cu_q, cu_k, **dict({"causal": False}, **kw))
    _assert_same(got, want)
    # flash-attn's usual self-attention call: the same offsets tensor twice
    c = make(lens_q=[10, 45], Hq=2, Hkv=2, seed=10)
    got = _grads(flash_attn_varlen_func, c, c["cu_q"], c["cu_q"], 45, 45, causal=True)
    _assert_same(got, _grads(gqa_det, c, c["cu_q"]))


def test_cu_seqlens_k_defaults_to_q_and_larger_max_seqlen_same_bits():
    c = make(lens_q=[5, 0, 70, 1], Hq=4, Hkv=1, seed=11)
    cu = c["cu_q"]
    want = _grads(gqa_det, c, cu, cu.clone())
    _assert_same(_grads(gqa_det, c, cu), want)
    _assert_same(_grads(gqa_det, c, cu, None), want)
    # max lengths above the longest document: more programs, the same bits
    _assert_same(_grads(gqa_det, c, cu, max_seqlen_q=130, max_seqlen_k=71), want)
    _assert_same(_grads(gqa_det, c, cu, max_seqlen_q=70, max_seqlen_k=70), want)


# ----------------------------------------------------------------------------- low level


@pytest.mark.parametrize("packed", [False, True])
def test_low_level_pair_same_bits_as_autograd(packed):
    c = (make(lens_q=[17, 0, 64, 30], lens_k=[20, 3, 64, 1], Hq=4, Hkv=2, seed=12) if packed
         else make(B=2, Sq=33, Sk=40, Hq=4, Hkv=2, seed=13))
    kw = {"window_size": (20, 0), "softcap": 4.0}
    want = run(gqa_det, c, **kw)
    plan = make_plan(64, torch.float32, DEV)
    out, lse, saved = gqa_det_fwd(*_args(c), plan=plan, **kw)
    assert saved.mode == "det" and saved.meta["plan"] is plan
    assert out.shape == c["q"].shape and lse.shape == want["lse"].shape
    dq, dk, dv = gqa_det_bwd(c["do"], saved)
    for n, t in zip(GRADS, (out, lse, dq, dk, dv), strict=True):
        assert bitwise_equal(t, want[n]), n
    # the backward again, with a workspace (NaN-filled: nothing read before written)
    ws = GQADetWorkspace.for_plan(plan, DEV, num_heads=4, max_tokens=c["q"].numel() // 256)
    ws["delta"].fill_(float("nan"))
    for t, n in zip(gqa_det_bwd(c["do"], saved, workspace=ws), ("dq", "dk", "dv"),
                    strict=True):
        assert bitwise_equal(t, want[n]), n


def test_low_level_forward_takes_leaves_requiring_grad():
    """gqa_det_fwd runs outside autograd: its outputs carry no graph."""
    c = make(B=1, Sq=20, Hq=2, Hkv=1, seed=14)
    q = c["q"].clone().requires_grad_()
    out, lse, saved = gqa_det_fwd(q, c["k"], c["v"])
    assert not out.requires_grad and not lse.requires_grad
    dq, _, _ = gqa_det_bwd(c["do"], saved)
    assert not dq.requires_grad and q.grad is None


def test_workspace_same_bits_as_without():
    c = make(lens_q=[12, 50, 0, 9], lens_k=[20, 50, 5, 9], Hq=4, Hkv=2, seed=15)
    plan = make_plan(64, torch.float32, DEV)
    want = _grads(gqa_det, c, c["cu_q"], c["cu_k"], plan=plan)
    for max_tokens in (71, 500):  # exactly the size, and larger
        ws = GQADetWorkspace.for_plan(plan, DEV, num_heads=4, max_tokens=max_tokens)
        ws["delta"].fill_(float("nan"))
        got = _grads(gqa_det, c, c["cu_q"], c["cu_k"], plan=plan, workspace=ws)
        _assert_same(got, want)
        got = _grads(gqa_det, c, c["cu_q"], c["cu_k"], workspace=ws)  # the default plan
        _assert_same(got, want)


# ----------------------------------------------------------------------------- poisoning


POISON_CASES = {
    # an empty document, a doc with queries and no keys, one with keys and no queries
    "packed ragged": (dict(lens_q=[0, 6, 0, 45, 1, 70], lens_k=[3, 0, 7, 45, 1, 33]), {}),
    # a window that leaves rows without keys (fully masked), windows cutting key blocks
    "window fully masked rows": (dict(lens_q=[40, 65], lens_k=[10, 65]),
                                 {"window_size": (3, 0)}),
    "batched more keys, not causal, window": (dict(B=2, Sq=30, Sk=70),
                                              {"causal": False, "window_size": (5, 2)}),
    "batched more queries, softcap": (dict(B=2, Sq=45, Sk=12), {"softcap": 2.0}),
    "batched no keys": (dict(B=2, Sq=9, Sk=0), {}),
    "packed no queries": (dict(lens_q=[0, 0], lens_k=[5, 40]), {}),
}


@pytest.mark.parametrize("name", list(POISON_CASES))
def test_outputs_fully_written(name):
    """Every buffer the launches allocate starts as NaN: the results have the bits of a
    plain call (tails, empty documents, rows and keys nobody sees included)."""
    shape_kw, kw = POISON_CASES[name]
    c = make(Hq=4, Hkv=2, seed=16, **shape_kw)
    clean = run(gqa_det, c, **kw)
    with poisoned_launch_buffers() as shapes:
        dirty = run(gqa_det, c, **kw)
    assert (tuple(c["q"].reshape(-1, 4, 64).shape)) in shapes  # the launches' buffers
    for n in GRADS:
        assert bitwise_equal(dirty[n], clean[n]), n
        if n != "lse":
            assert bool(torch.isfinite(dirty[n]).all()), n
        else:
            assert not bool(torch.isnan(dirty[n]).any()), n


def test_low_level_outputs_fully_written():
    c = make(lens_q=[0, 6, 50], lens_k=[4, 0, 50], Hq=4, Hkv=2, seed=17)
    out0, lse0, s0 = gqa_det_fwd(*_args(c), window_size=(9, 0))
    g0 = gqa_det_bwd(c["do"], s0)
    with poisoned_launch_buffers():
        out1, lse1, s1 = gqa_det_fwd(*_args(c), window_size=(9, 0))
        g1 = gqa_det_bwd(c["do"], s1)
    _assert_same([out1, *g1], [out0, *g0])
    assert bitwise_equal(lse0, lse1)


# ----------------------------------------------------------------------------- autograd


def test_checkpoint_same_grads():
    c = make(lens_q=[20, 0, 50], lens_k=[25, 3, 50], Hq=4, Hkv=2, seed=18)

    def f(q, k, v):
        out, lse = gqa_det(q, k, v, c["cu_q"], c["cu_k"], return_lse=True, softcap=5.0)
        return out * torch.sigmoid(lse.t()[..., None])

    want = _grads(f, c)
    got = _grads(lambda q, k, v: torch.utils.checkpoint.checkpoint(f, q, k, v,
                                                                   use_reentrant=False), c)
    _assert_same(got, want)


def test_double_backward_refused():
    c = make(B=1, Sq=20, Hq=2, Hkv=1, seed=19)
    for wrt in "qkv":
        leaves = {n: c[n].clone().requires_grad_() for n in "qkv"}
        out = gqa_det(leaves["q"], leaves["k"], leaves["v"])
        (g,) = torch.autograd.grad(out.pow(2).sum(), leaves[wrt], create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice"):
            g.pow(2).sum().backward()


def test_grads_only_where_required():
    c = make(lens_q=[10, 40], lens_k=[12, 40], Hq=4, Hkv=2, seed=20)
    want = _grads(gqa_det, c, c["cu_q"], c["cu_k"])
    for needs in ("q", "k", "v", "kv"):
        leaves = {n: c[n].clone().requires_grad_(n in needs) for n in "qkv"}
        out = gqa_det(leaves["q"], leaves["k"], leaves["v"], c["cu_q"], c["cu_k"])
        out.backward(c["do"])
        for i, n in enumerate("qkv"):
            if n in needs:
                assert bitwise_equal(leaves[n].grad, want[1 + i]), (needs, n)
            else:
                assert leaves[n].grad is None, (needs, n)
    out = gqa_det(c["q"], c["k"], c["v"], c["cu_q"], c["cu_k"])  # nothing requires grad
    assert not out.requires_grad and out.grad_fn is None
    with torch.no_grad():
        q = c["q"].clone().requires_grad_()
        assert not gqa_det(q, c["k"], c["v"], c["cu_q"], c["cu_k"]).requires_grad


@pytest.mark.parametrize("packed", [True, False])
def test_non_contiguous_inputs_same_bits(packed):
    """q, k, v sliced from one qkv tensor (strided in the token and head dims) give the
    bits of contiguous copies; so do head-major tensors transposed to [B, S, H, D]."""
    Hq, Hkv, D = 4, 2, 64
    lead = (70,) if packed else (2, 35)
    qkv = randn((*lead, Hq + 2 * Hkv, D), torch.float32, DEV, seed=21)
    do = randn((*lead, Hq, D), torch.float32, DEV, seed=22)
    extra = (lens_to_cu([30, 40]),) if packed else ()

    def split(t):
        return t[..., :Hq, :], t[..., Hq:Hq + Hkv, :], t[..., Hq + Hkv:, :]

    def step(qkv):
        q, k, v = split(qkv)
        assert not q.is_contiguous() and not k.is_contiguous()
        return gqa_det(q, k, v, *extra, softcap=3.0)

    def plain(q, k, v):
        return gqa_det(q.contiguous(), k.contiguous(), v.contiguous(), *extra, softcap=3.0)

    leaf = qkv.clone().requires_grad_()
    out = step(leaf)
    out.backward(do)
    got = [out.detach(), *split(leaf.grad)]
    want = _grads(plain, dict(zip("qkv", split(qkv), strict=True), do=do))
    _assert_same([t.contiguous() for t in got], want)
    if not packed:  # [B, H, S, D] storage seen as [B, S, H, D]: dims 1 and 2 swapped
        c = {n: t.transpose(1, 2).contiguous().transpose(1, 2)
             for n, t in zip("qkv", split(qkv), strict=True)}
        c["do"] = do
        assert c["q"].stride(1) == D and not c["q"].is_contiguous()
        _assert_same(_grads(gqa_det, c, softcap=3.0),
                     _grads(plain, c))
    else:  # packed head-major storage [H, T, D] seen as [T, H, D]: head stride T*D (copied)
        c = {n: t.transpose(0, 1).contiguous().transpose(0, 1)
             for n, t in zip("qkv", split(qkv), strict=True)}
        c["do"] = do
        assert c["q"].stride(1) == 70 * D and not c["q"].is_contiguous()
        _assert_same(_grads(lambda q, k, v: gqa_det(q, k, v, *extra, softcap=3.0), c),
                     _grads(plain, c))


def test_tma_rows_copies_only_what_descriptors_cannot_read():
    """The kernels' descriptors read [T, H * D] rows: heads contiguous in a token, rows of
    16-byte multiples, a 16-byte aligned base. Anything else is copied, never changed."""
    from cake_gqa_det_train.launch import row_stride, tma_rows

    x = randn((10, 4, 64), torch.float32, DEV, seed=30)
    assert tma_rows(x) is x
    sliced = randn((10, 8, 64), torch.float32, DEV, seed=31)[:, 2:6]  # token stride 8 * 64
    assert tma_rows(sliced) is sliced
    head_major = x.transpose(0, 1).contiguous().transpose(0, 1)
    odd = torch.empty(10 * 4 * 64 + 1, dtype=torch.float32, device=DEV)[1:].view(10, 4, 64)
    odd.copy_(x)
    for t in (head_major, odd):
        y = tma_rows(t)
        assert y is not t and y.is_contiguous() and torch.equal(y, x)
    one = x[:1].as_strided((1, 4, 64), (3, 64, 1))  # one token: its stride addresses nothing
    assert row_stride(one) == 4 * 64 and tma_rows(one) is one


def test_misaligned_inputs_same_bits():
    """q, k, v and dout starting one element past an aligned address (copied for the
    descriptors) give the bits of aligned tensors, and stay unchanged."""
    c = make(lens_q=[30, 1, 0, 65], Hq=4, Hkv=2, seed=32)

    def shifted(t, grad):
        buf = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        buf[1:].copy_(t.reshape(-1))
        buf.requires_grad_(grad)
        return buf, buf[1:].view(t.shape)

    bufs, views = zip(*(shifted(c[n], n != "do") for n in ("q", "k", "v", "do")),
                      strict=True)
    assert all(x.data_ptr() % 16 != 0 for x in views)
    before = [x.detach().clone() for x in views]
    out = gqa_det(*views[:3], c["cu_q"], c["cu_k"])
    out.backward(views[3])
    got = [out.detach()] + [b.grad[1:].view(x.shape)
                            for b, x in zip(bufs[:3], views[:3], strict=True)]
    want = _grads(lambda q, k, v: gqa_det(q, k, v, c["cu_q"], c["cu_k"]), c)
    _assert_same(got, want)
    for x, t in zip(views, before, strict=True):
        assert torch.equal(x.detach(), t)


# ----------------------------------------------------------------------------- zero tokens


@pytest.mark.parametrize("B,Sq,Sk", [(2, 0, 0), (2, 0, 5), (0, 4, 4), (1, 0, 33)])
def test_zero_token_batches(B, Sq, Sk):
    c = make(B=B, Sq=Sq, Sk=Sk, Hq=4, Hkv=2, seed=23)
    got = run(gqa_det, c)
    assert got["out"].shape == (B, Sq, 4, 64) and got["lse"].shape == (B, 4, Sq)
    assert got["dq"].shape == c["q"].shape and got["dk"].shape == c["k"].shape
    assert bool((got["dk"] == 0).all()) and bool((got["dv"] == 0).all())


def test_zero_query_tokens_packed():
    c = make(lens_q=[0, 0, 0], lens_k=[0, 7, 2], Hq=4, Hkv=2, seed=24)
    got = run(gqa_det, c)
    assert got["out"].shape == (0, 4, 64) and got["lse"].shape == (4, 0)
    assert got["dk"].shape == (9, 2, 64) and bool((got["dk"] == 0).all())
    assert bool((got["dv"] == 0).all())


# ----------------------------------------------------------------------------- compile


def _recording_backend(seen):
    def backend(gm, example_inputs):
        seen.append(graph_code(gm))
        return gm.forward
    return backend


def _assert_compiles_to_gqa_ops(step, leaves, args, names):
    """cake_core.testing.assert_compiles_to_op (one frame, eager bits), with the op found
    in the traced subgraphs: dynamo traces the autograd.Function as
    ``autograd_function_apply`` in the top graph and ``torch.ops.cake_gqa_det_train.fwd``
    / ``.bwd`` in its ``fwd_body`` / ``bwd_body`` subgraphs, where assert_compiles_to_op's
    top-graph check does not look."""
    seen = []
    compiled = assert_compiles_to_op(step, leaves, args, names,
                                     backend=_recording_backend(seen),
                                     op="autograd_function_apply")
    assert len(seen) == 1
    assert "torch.ops.cake_gqa_det_train.fwd" in seen[0]
    assert "torch.ops.cake_gqa_det_train.bwd" in seen[0]
    return compiled


def test_compile_fullgraph_batched():
    c = make(B=2, Sq=40, Sk=48, Hq=4, Hkv=2, seed=25)

    def step(q, k, v, do):
        out, lse = gqa_det(q, k, v, return_lse=True, window_size=(7, 0), softcap=2.0)
        return (out * do).sum(), out, lse

    _assert_compiles_to_gqa_ops(step, (c["q"], c["k"], c["v"]), (c["do"],),
                                ("out", "lse", "dq", "dk", "dv"))


def test_compile_fullgraph_packed_and_offsets_checked_when_run():
    c = make(lens_q=[0, 5, 40, 3], lens_k=[2, 5, 40, 10], Hq=4, Hkv=2, seed=26)

    def step(q, k, v, do, cu_q, cu_k):
        out, lse = gqa_det(q, k, v, cu_q, cu_k, return_lse=True)
        return (out * do).sum(), out, lse

    leaves = (c["q"], c["k"], c["v"])
    compiled = _assert_compiles_to_gqa_ops(step, leaves, (c["do"], c["cu_q"], c["cu_k"]),
                                           ("out", "lse", "dq", "dk", "dv"))
    # offsets' values are not read while tracing; the op checks them when it runs
    bad = torch.tensor([0, 30, 5, 45, 48], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens_q: must be non-decreasing"):
        compiled(*leaves, c["do"], bad, c["cu_k"])


def test_compile_bits_equal_to_eager_flash_attn_func():
    torch._dynamo.reset()
    c = make(B=1, Sq=33, Hq=2, Hkv=1, seed=27)

    def step(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out * out).sum(), out

    leaves = (c["q"], c["k"], c["v"])
    want = leaf_grads(step, leaves)
    got = leaf_grads(torch.compile(step, fullgraph=True, backend="eager"), leaves)
    _assert_same(got, want)


# ----------------------------------------------------------------------------- compile edge cases


def test_compile_packed_same_offsets_for_q_and_k():
    c = make(lens_q=[0, 5, 40, 3], Hq=4, Hkv=2, seed=28)

    def step(q, k, v, do, cu):
        out = gqa_det(q, k, v, cu)
        return (out * do).sum(), out

    _assert_compiles_to_gqa_ops(step, (c["q"], c["k"], c["v"]), (c["do"], c["cu_q"]),
                                ("out", "dq", "dk", "dv"))


def test_compile_refuses_small_max_seqlen():
    torch._dynamo.reset()
    c = make(lens_q=[10, 40, 30], Hq=2, Hkv=1, seed=29)
    cu_k = c["cu_q"].clone()

    def f(q, k, v, cu_q, cu_k, mq, mk):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)

    cf = torch.compile(f, fullgraph=True, backend="eager")
    cf(c["q"], c["k"], c["v"], c["cu_q"], cu_k, 40, 40)
    with pytest.raises(ValueError, match="max_seqlen_q: 20 is below the longest document"):
        cf(c["q"], c["k"], c["v"], c["cu_q"], cu_k, 20, 40)


def test_flash_attn_flags_as_flash_attn_takes_them():
    """flash-attn's ``causal`` accepts 0 / 1 and numpy bools (gqa_det wants a bool)."""
    import numpy as np

    c = make(B=1, Sq=20, Hq=2, Hkv=1, D=64, seed=40)
    want = flash_attn_func(c["q"], c["k"], c["v"], causal=True)
    for flag in (1, np.bool_(True)):
        assert bitwise_equal(flash_attn_func(c["q"], c["k"], c["v"], causal=flag), want)


def test_plan_for_another_element_size_refused():
    c = make(B=1, Sq=20, Hq=2, Hkv=1, D=64, seed=41)
    with pytest.raises(ValueError, match="plan: made for 2-byte inputs, q is float32"):
        gqa_det(c["q"], c["k"], c["v"], plan=make_plan(64, torch.bfloat16, DEV))
