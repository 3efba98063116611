"""MoEFeedForward (cake_moe_grouped_det_gemm.moe): parity with a float64 loop over tokens
and experts (forward, aux loss, every gradient), routing edge cases, ties, bad inputs and
plan mode checks."""

import dataclasses

import cake_moe_grouped_det_gemm.api as api
import pytest
import torch
from _moe_cases import DEV
from cake_core import Mode
from cake_core.testing import (
    TOLERANCES,
    assert_close_to_reference,
    assert_raises_unmodified,
    bitwise_equal,
    randn,
)
from cake_moe_grouped_det_gemm import (
    MoEFeedForward,
    MoEFeedForwardPlans,
    make_moe_plans,
    make_plan,
    moe_experts_det,
    moe_feed_forward_det,
    moe_feed_forward_reference,
    moe_route_det,
    moe_topk_det,
)

D, F, E = 24, 20, 5


def params(E=E, d=D, f=F, dtype=torch.float32, seed=0):
    """router_weight [E, d], w_gate_up [E, 2f, d], w_down [E, d, f]."""
    return (randn((E, d), dtype, DEV, seed=seed + 1, scale=d ** -0.5),
            randn((E, 2 * f, d), dtype, DEV, seed=seed + 2, scale=d ** -0.5),
            randn((E, d, f), dtype, DEV, seed=seed + 3, scale=f ** -0.5))


def run_both(x, weights, top_k, dy, *, coef=0.01, normalize=True, aux_scale=3.0):
    """Layer and float64 reference: outputs and the gradients of
    ``<y, dy> + aux_scale · aux`` with respect to x and the three weights."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, *weights)]
    y, aux = moe_feed_forward_det(*leaves, top_k, normalize_topk=normalize,
                                  aux_loss_coef=coef)
    ((y.float() * dy.float()).sum() + aux_scale * aux).backward()
    refs = [t.detach().double().requires_grad_() for t in (x, *weights)]
    yr, ar = moe_feed_forward_reference(*refs, top_k, normalize_topk=normalize,
                                        aux_loss_coef=coef)
    ((yr * dy.double()).sum() + aux_scale * ar).backward()
    def grads(ts):  # a leaf the loss does not reach (T = 0) has gradient zero
        return [torch.zeros_like(t) if t.grad is None else t.grad for t in ts]

    return (y.detach(), aux.detach(), *grads(leaves)), (yr.detach(), ar.detach(), *grads(refs))


def check(got, want, dtype):
    names = ("y", "aux", "dx", "drouter", "dw_gate_up", "dw_down")
    for name, g, w in zip(names, got, want, strict=True):
        g, w = g.detach(), w.detach()
        assert g.shape == w.shape, name
        assert bool(torch.isfinite(g).all()), name
        if w.numel() == 0 or float(w.abs().max()) == 0:
            assert bool((g == 0).all()), name
        elif name == "aux":
            assert abs(float(g) - float(w)) <= 1e-6 * abs(float(w)) + 1e-9, (float(g), float(w))
        else:
            # the router gradient passes the fp32 softmax: a few fp32 roundings more
            tol = 4 * TOLERANCES[dtype] if name == "drouter" else None
            assert_close_to_reference(g, w, dtype, name=name, tol=tol)


def biased_x(T, dtype=torch.float32, seed=4):
    """x whose feature 0 is a constant 4, so router column 0 acts as a per-expert bias."""
    x = randn((T, D), torch.float32, DEV, seed=seed)
    x[:, 0] = 4.0
    return x.to(dtype)


@pytest.mark.parametrize("top_k,normalize", [(2, True), (1, False), (3, False)])
def test_parity_fp32(top_k, normalize):
    T = 37  # not a multiple of any block
    x = randn((T, D), torch.float32, DEV, seed=4)
    dy = randn((T, D), torch.float32, DEV, seed=5)
    got, want = run_both(x, params(), top_k, dy, normalize=normalize)
    check(got, want, torch.float32)


def test_parity_leading_dims_bf16():
    x = randn((3, 7, D), torch.bfloat16, DEV, seed=6)
    dy = randn((3, 7, D), torch.bfloat16, DEV, seed=7)
    got, want = run_both(x, params(dtype=torch.bfloat16), 2, dy)
    assert got[0].dtype == torch.bfloat16 and got[0].shape == (3, 7, D)
    assert got[1].dtype == torch.float32
    check(got, want, torch.bfloat16)


def test_empty_expert_and_all_tokens_on_one():
    """Router column 0 against a constant feature: expert 0 is always first, expert 2 never
    chosen. k=2: expert 2 empty (exact-zero weight gradients); k=1: every token on
    expert 0 and every other expert empty."""
    T = 21
    r, wgu, wd = params()
    r = r * 0.2  # small random logits (|.| < 1.2 here), a bias of +-2.4: no saturation
    r[:, 0] = 0.0
    r[0, 0], r[2, 0] = 0.6, -0.6
    x = biased_x(T)
    dy = randn((T, D), torch.float32, DEV, seed=5)
    for top_k, empty in ((2, [2]), (1, [1, 2, 3, 4])):
        routing = moe_route_det(x @ r.t(), top_k)
        counts = torch.diff(routing.offs, prepend=routing.offs.new_zeros(1)).tolist()
        assert [e for e in range(E) if counts[e] == 0] == empty
        got, want = run_both(x, (r, wgu, wd), top_k, dy)
        check(got, want, torch.float32)
        for e in empty:
            assert bool((got[4][e] == 0).all()) and bool((got[5][e] == 0).all())
        assert bool((got[3] != 0).any(dim=1).all())  # every router row gets a gradient


def test_no_tokens_and_single_expert():
    x = torch.zeros((0, D), device=DEV)
    got, want = run_both(x, params(), 2, x)
    check(got, want, torch.float32)
    assert float(got[1]) == 0.0
    x = randn((9, D), torch.float32, DEV, seed=4)
    dy = randn((9, D), torch.float32, DEV, seed=5)
    got, want = run_both(x, params(E=1), 1, dy)
    check(got, want, torch.float32)
    # one expert, top-1, normalised: weight 1, aux = coef * 1 * 1 * 1
    assert abs(float(got[1]) - 0.01) < 1e-7 and float(got[3].abs().max()) < 1e-6


def test_aux_loss_coef_zero_and_uniform_router():
    x = randn((16, D), torch.float32, DEV, seed=4)
    r, wgu, wd = params()
    _, aux = moe_feed_forward_det(x, r, wgu, wd, 2, aux_loss_coef=0.0)
    assert float(aux) == 0.0 and aux.dtype == torch.float32
    # a zero router: p = 1/E everywhere, ties everywhere -> experts 0 and 1 for every token;
    # aux = coef * E * (1/2 + 1/2) * 1/E = coef
    _, aux = moe_feed_forward_det(x, torch.zeros_like(r), wgu, wd, 2, aux_loss_coef=0.5)
    assert abs(float(aux) - 0.5) < 1e-6


def test_ties_broken_to_lower_index_every_run():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.3, 0.3, 0.3], [0.4, 0.1, 0.4, 0.1]],
                         device=DEV)
    w, ids = moe_topk_det(probs, 2)
    assert ids.tolist() == [[0, 1], [1, 2], [0, 2]]
    assert w.tolist() == probs.gather(1, ids).tolist()
    # experts 1 and 2 have the same router row: every token ties them exactly; the layer
    # must pick 1 before 2 (and the float64 loop agrees, with the same rule)
    r, wgu, wd = params(E=4)
    r = r.clone()
    r[2] = r[1]
    x = randn((40, D), torch.float32, DEV, seed=8)
    dy = randn((40, D), torch.float32, DEV, seed=9)
    ids = [moe_route_det(x @ r.t(), 2).ids for _ in range(2)]
    assert torch.equal(ids[0], ids[1])
    has2 = (ids[0] == 2).any(1)
    assert bool(has2.any())
    assert bool((ids[0][has2] == torch.tensor([1, 2], device=DEV)).all(1).all())
    got, want = run_both(x, (r, wgu, wd), 2, dy)
    check(got, want, torch.float32)


def test_module():
    torch.manual_seed(0)
    m = MoEFeedForward(D, F, E, 2, aux_loss_coef=0.02, normalize_topk=False, device=DEV)
    assert m.router_weight.shape == (E, D) and m.w_gate_up.shape == (E, 2 * F, D)
    assert m.w_down.shape == (E, D, F)
    assert sorted(m.state_dict()) == ["router_weight", "w_down", "w_gate_up"]
    assert float(m.w_gate_up.detach().abs().max()) <= D ** -0.5
    assert float(m.w_down.detach().abs().max()) <= F ** -0.5
    assert "top_k=2" in repr(m)
    x = randn((2, 5, D), torch.float32, DEV, seed=3)
    y, aux = m(x)
    y2, aux2 = moe_feed_forward_det(x, m.router_weight, m.w_gate_up, m.w_down, 2,
                                    normalize_topk=False, aux_loss_coef=0.02)
    assert torch.equal(y, y2) and torch.equal(aux, aux2) and y.shape == x.shape
    for bad in (dict(top_k=0), dict(top_k=E + 1), dict(top_k=True), dict(num_experts=0),
                dict(d_ff=1.5), dict(aux_loss_coef=-1.0), dict(aux_loss_coef=float("nan")),
                dict(normalize_topk=1)):
        kw = {"d_model": D, "d_ff": F, "num_experts": E, "top_k": 2, **bad}
        with pytest.raises(ValueError):
            MoEFeedForward(kw.pop("d_model"), kw.pop("d_ff"), kw.pop("num_experts"),
                           kw.pop("top_k"), **kw)


# ----------------------------------------------------------------------------- refusals


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_fwd", "_launch_bwd", "_grouped_mm", "_launch_wgrad"):
        monkeypatch.setattr(api, name, boom)


def _base():
    r, wgu, wd = params()
    return {"x": randn((6, D), torch.float32, DEV, seed=4), "router_weight": r,
            "w_gate_up": wgu, "w_down": wd, "top_k": 2}


BAD = {
    "x last dim": (dict(x=torch.ones(6, D + 1)), "x: last dim must be d_model=24"),
    "x int": (dict(x=torch.ones(6, D, dtype=torch.int32)), "x: expected dtype"),
    "x not a tensor": (dict(x=[[1.0] * D]), "x: expected a torch.Tensor"),
    "x 0-d": (dict(x=torch.tensor(1.0)), "x: expected at least 1-D"),
    "router 3-D": (dict(router_weight=torch.ones(1, E, D)), "router_weight: expected 2-D"),
    "w_gate_up rows": (dict(w_gate_up=torch.ones(E, 2 * F + 1, D)),
                       r"w_gate_up: expected shape \[5, 40, 24\]"),
    "w_gate_up experts": (dict(w_gate_up=torch.ones(E - 1, 2 * F, D)), "w_gate_up: expected"),
    "w_down shape": (dict(w_down=torch.ones(E, D + 1, F)), r"w_down: expected shape"),
    "w_down dtype": (dict(w_down=torch.ones(E, D, F, dtype=torch.bfloat16)),
                     "w_down: expected dtype in \\(float32\\)"),
    "w_gate_up dtype": (dict(w_gate_up=torch.ones(E, 2 * F, D, dtype=torch.float16)),
                        "w_gate_up: expected dtype"),
    "top_k 0": (dict(top_k=0), r"top_k: must be an int in \[1, num_experts=5\]"),
    "top_k > E": (dict(top_k=E + 1), "top_k"),
    "top_k float": (dict(top_k=2.0), "top_k"),
    "normalize int": (dict(normalize_topk=1), "normalize_topk: expected a bool"),
    "coef negative": (dict(aux_loss_coef=-0.1), "aux_loss_coef"),
    "coef inf": (dict(aux_loss_coef=float("inf")), "aux_loss_coef"),
    "device": (dict(router_weight=torch.ones(E, D, device="meta")),
               "router_weight: on meta"),
    "plans type": (dict(plans=(None, None, None)), "plans: expected MoEFeedForwardPlans"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_refused_before_launch(case, no_launch):
    change, match = BAD[case]
    assert_raises_unmodified(moe_feed_forward_det, {**_base(), **change}, match)


def test_plans_mode_and_key_checked_before_launch(no_launch):
    base = _base()
    good = make_moe_plans(6, D, F, E, 2, torch.float32, DEV)
    nondet = dataclasses.replace(good.gate_up)
    object.__setattr__(nondet, "mode", Mode.NONDET)
    cases = {
        "mode=nondet": good._replace(gate_up=nondet),
        "plan: made for num_experts=5, out_features=24, in_features=20": good._replace(
            gate_up=good.down),
        "plan: got dict": good._replace(router=good.router.to_dict()),
        "plan: made for num_experts=1": good._replace(
            router=make_plan(6, 1, E + 1, D, torch.float32, DEV)),
    }
    for match, plans in cases.items():
        assert_raises_unmodified(moe_feed_forward_det, {**base, "plans": plans}, match)
    with pytest.raises(ValueError, match="top_k"):
        make_moe_plans(6, D, F, E, E + 1, torch.float32, DEV)


def test_explicit_plans_give_default_bits():
    base = _base()
    plans = make_moe_plans(6, D, F, E, 2, torch.float32, DEV)
    assert isinstance(plans, MoEFeedForwardPlans)
    y0, a0 = moe_feed_forward_det(**base)
    y1, a1 = moe_feed_forward_det(**base, plans=plans)
    assert torch.equal(y0, y1) and torch.equal(a0, a1)


@pytest.mark.parametrize("T,k,dtype", [(13, 3, torch.float32), (9, 1, torch.bfloat16),
                                       (0, 2, torch.float32), (7, E, torch.float32)])
def test_combine_and_permute_kernels_match_float64(T, k, dtype):
    """moe_unpermute_det (combine) and moe_permute_det's backward, the gather-sum kernels:
    forward and every gradient against float64 on fresh values (dy not contiguous),
    bitwise repeatable."""
    from cake_moe_grouped_det_gemm import moe_permute_det, moe_unpermute_det
    r = moe_route_det(randn((T, E), torch.float32, DEV, seed=1), k)
    out = randn((T * k, D), dtype, DEV, seed=2).requires_grad_()
    w = r.weights.detach().clone().requires_grad_()
    r = r._replace(weights=w)
    dy = randn((D, T), torch.float32, DEV, seed=3).t().to(dtype)   # column-major view
    y = moe_unpermute_det(out, r)
    dout, dw = torch.autograd.grad(y, (out, w), dy)
    o64, w64 = out.detach().double(), w.detach().double()
    slot = r.slot.view(T, k)
    y64 = sum(w64[:, j, None] * o64[slot[:, j]] for j in range(k)) if T else \
        torch.zeros(0, D, dtype=torch.float64)
    dout64 = torch.zeros_like(o64)
    for j in range(k):
        dout64[slot[:, j]] = w64[:, j, None] * dy.double()
    dw64 = torch.stack([(dy.double() * o64[slot[:, j]]).sum(-1) for j in range(k)], 1) \
        if T else torch.zeros(0, k, dtype=torch.float64)
    assert_close_to_reference(y, y64, dtype, name="y")
    assert_close_to_reference(dout, dout64, dtype, name="dout")
    assert_close_to_reference(dw, dw64, torch.float32, name="dweights")
    again = torch.autograd.grad(moe_unpermute_det(out, r), (out, w), dy)
    assert all(bitwise_equal(a, b) for a, b in zip((dout, dw), again, strict=True))
    x = randn((T, D), dtype, DEV, seed=4).requires_grad_()
    g = randn((T * k, D), dtype, DEV, seed=5)
    (dx,) = torch.autograd.grad(moe_permute_det(x, r), x, g)
    dx64 = sum(g.double()[slot[:, j]] for j in range(k)) if T else torch.zeros(0, D)
    assert_close_to_reference(dx, dx64, dtype, name="dx")


def test_combine_and_permute_with_a_strided_slot_equal_the_contiguous_routing():
    """A user-built MoERouting whose ``slot`` is a strided view gathers the same rows."""
    from cake_moe_grouped_det_gemm import moe_permute_det, moe_unpermute_det
    T, k = 11, 2
    r = moe_route_det(randn((T, E), torch.float32, DEV, seed=1), k)
    wide = torch.zeros((T * k, 2), dtype=r.slot.dtype, device=DEV)
    wide[:, 0] = r.slot
    rs = r._replace(slot=wide[:, 0])
    assert not rs.slot.is_contiguous()
    out = randn((T * k, D), torch.float32, DEV, seed=2).requires_grad_()
    x = randn((T, D), torch.float32, DEV, seed=4).requires_grad_()
    dy = randn((T, D), torch.float32, DEV, seed=3)
    g = randn((T * k, D), torch.float32, DEV, seed=5)
    got, want = [], []
    for routing, into in ((rs, got), (r, want)):
        y = moe_unpermute_det(out, routing)
        into += [y, *torch.autograd.grad(y, out, dy)]
        into += torch.autograd.grad(moe_permute_det(x, routing), x, g)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_combine_and_permute_refuse_rows_that_do_not_match_the_routing(monkeypatch):
    """moe_unpermute_det with fewer than T·k rows read past ``out`` in the gather kernel
    (more rows got uninitialized gradients), moe_permute_det took any x: now ValueError
    before any launch, the caller's tensors unchanged."""
    import cake_moe_grouped_det_gemm.moe as moe
    from cake_moe_grouped_det_gemm import moe_permute_det, moe_unpermute_det

    class Boom:  # launched as kernel[grid](...)
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(moe, "gather_sum_kernel", Boom())
    T, k = 6, 2
    r = moe_route_det(randn((T, E), torch.float32, DEV, seed=1), k)
    out = randn((T * k, D), torch.float32, DEV, seed=2)
    x = randn((T, D), torch.float32, DEV, seed=4)
    for kw, match in (
            (dict(out=out[:5], routing=r), r"out: expected shape \[12, \*\]"),
            (dict(out=randn((T * k + 1, D), torch.float32, DEV, seed=2), routing=r),
             r"out: expected shape \[12, \*\]"),
            (dict(out=out.reshape(-1), routing=r), "out: expected 2-D"),
            (dict(out=out.to(torch.int32), routing=r), "out: expected a floating"),
            (dict(out=out, routing=(1, 2)), "routing: expected a MoERouting")):
        assert_raises_unmodified(moe_unpermute_det, kw, match)
    for kw, match in ((dict(x=x[:3], routing=r), r"x: expected shape \[6, \*\]"),
                      (dict(x=x[:, 0], routing=r), "x: expected 2-D"),
                      (dict(x=x.to(torch.int32), routing=r), "x: expected a floating"),
                      (dict(x=x, routing=None), "routing: expected a MoERouting")):
        assert_raises_unmodified(moe_permute_det, kw, match)


def test_layer_takes_the_routings_offsets_as_row_ends(monkeypatch):
    """The layer's GEMMs read the routing's offsets as row ends directly: no clamping launch
    (``_row_ends``) in a forward, and the same bits as the public GEMM over those offsets."""
    from cake_moe_grouped_det_gemm import moe_grouped_det_gemm
    from cake_moe_grouped_det_gemm.moe import _feed_forward

    x = randn((29, D), torch.float32, DEV, seed=11)
    dy = randn((29, D), torch.float32, DEV, seed=12)

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, *params())]
        y, aux = fn(*leaves)
        ((y * dy).sum() + aux).backward()
        return [y, aux] + [t.grad for t in leaves]

    def public(xx, w, offs, *, plan):
        return moe_grouped_det_gemm(xx, w, offs, plan=plan)

    want = grads(lambda *t: _feed_forward(*t, 2, True, 0.01, None, gemm=public))

    def boom(*a, **k):
        raise AssertionError("the layer clamped its own routing's offsets")

    monkeypatch.setattr(api, "_row_ends", boom)
    got = grads(lambda *t: moe_feed_forward_det(*t, 2, normalize_topk=True, aux_loss_coef=0.01))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


# ----------------------------------------------------------------------------- moe_experts_det


def _experts_both(x, weights, top_k, dy, *, normalize=True, logits_dtype=None):
    """moe_experts_det under logits the caller computes (x · Rᵀ in ``logits_dtype``, a
    transformers-style router), and the float64 layer reference without the aux loss:
    y and the gradients of ``<y, dy>`` in x and the three weights."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, *weights)]
    xx, r, wgu, wd = leaves
    dt = logits_dtype or x.dtype
    logits = xx.to(dt) @ r.to(dt).t()
    y = moe_experts_det(xx, logits, wgu, wd, top_k, normalize_topk=normalize)
    (y.float() * dy.float()).sum().backward()
    refs = [t.detach().double().requires_grad_() for t in (x, *weights)]
    yr, _ = moe_feed_forward_reference(*refs, top_k, normalize_topk=normalize,
                                       aux_loss_coef=0.0)
    (yr * dy.double()).sum().backward()
    return y.detach(), [t.grad for t in leaves], yr.detach(), [t.grad for t in refs]


@pytest.mark.parametrize("top_k,normalize,lead", [(2, True, (7,)), (1, False, (2, 5)),
                                                   (3, True, (1,))])
def test_experts_entry_against_float64(top_k, normalize, lead):
    x = randn((*lead, D), torch.float32, DEV, seed=11)
    weights = params(seed=5)
    dy = randn((*lead, D), torch.float32, DEV, seed=12)
    y, grads, yr, grads_r = _experts_both(x, weights, top_k, dy, normalize=normalize)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close_to_reference(y, yr, torch.float32, name="y")
    for name, g, w in zip(("dx", "drouter", "dw_gate_up", "dw_down"), grads, grads_r,
                          strict=True):
        tol = 4 * TOLERANCES[torch.float32] if name in ("dx", "drouter") else None
        assert_close_to_reference(g, w, torch.float32, name=name, tol=tol)


def test_experts_entry_equals_the_layer_for_the_layers_logits():
    """Given the logits the layer computes (its fp32 router GEMM), the experts entry gives
    the layer's y bit for bit (the same routing, GEMMs and combine)."""
    x = biased_x(9)
    r, wgu, wd = params(seed=2)
    y_layer, _ = moe_feed_forward_det(x, r, wgu, wd, 2, aux_loss_coef=0.0)
    rows = torch.full((1,), 9, dtype=torch.int32, device=DEV)
    logits = api.routed_gemm(x.float(), r.float()[None], rows)
    assert bitwise_equal(moe_experts_det(x, logits, wgu, wd, 2), y_layer)
    # and a bf16 model's bf16 logits: softmax in fp32 on them, y in bf16, repeatable
    xb, wgub, wdb = x.bfloat16(), wgu.bfloat16(), wd.bfloat16()
    lb = xb @ r.bfloat16().t()
    y0 = moe_experts_det(xb, lb, wgub, wdb, 2)
    assert y0.dtype == torch.bfloat16
    assert bitwise_equal(moe_experts_det(xb, lb, wgub, wdb, 2), y0)


def test_experts_entry_no_tokens():
    x = torch.empty((0, D), device=DEV, requires_grad=True)
    _, wgu, wd = params()
    logits = torch.empty((0, E), device=DEV, requires_grad=True)
    y = moe_experts_det(x, logits, wgu, wd, 2)
    assert y.shape == (0, D)
    y.sum().backward()


def _experts_base():
    x = randn((6, D), torch.float32, DEV, seed=3)
    _, wgu, wd = params()
    return dict(x=x, router_logits=randn((6, E), torch.float32, DEV, seed=4), w_gate_up=wgu,
                w_down=wd, top_k=2)


EXPERTS_BAD = {
    "logits rows": (dict(router_logits=torch.randn(5, E, device=DEV)), "router_logits"),
    "logits experts": (dict(router_logits=torch.randn(6, E + 1, device=DEV)), "router_logits"),
    "logits int": (dict(router_logits=torch.ones(6, E, dtype=torch.int64, device=DEV)),
                   "router_logits"),
    "logits meta": (dict(router_logits=torch.ones(6, E, device="meta")),
                    "router_logits: on meta"),
    "top_k": (dict(top_k=E + 1), "top_k"),
    "w_down": (dict(w_down=torch.randn(E, D + 1, F, device=DEV)), "w_down"),
    "w_gate_up dtype": (dict(w_gate_up=torch.randn(E, 2 * F, D, device=DEV).double()),
                        "w_gate_up"),
    "normalize": (dict(normalize_topk=1), "normalize_topk"),
    "plans": (dict(plans=(None, None, None)), "plans: expected MoEFeedForwardPlans"),
}


@pytest.mark.parametrize("case", list(EXPERTS_BAD))
def test_experts_entry_bad_inputs_refused_before_launch(case, no_launch):
    change, match = EXPERTS_BAD[case]
    assert_raises_unmodified(moe_experts_det, {**_experts_base(), **change}, match)
