"""plan.keep_states: the forward keeps the chunk states h, w, v_new (and g's cumsum) for the
backward, which then skips the chunk prep and the forward recurrence. Same bits as
keep_states = 0 (the backward's recompute runs the same kernels on the same inputs); the
kept tensors are the saved set's own (no workspace aliasing); serialisation; the custom-op
path (always recomputes) and checkpointing give the eager bits. FLA's disable_recompute:
the rule's plan with keep_states = 1 (a plan given must keep the states), off by
truthiness."""

import dataclasses
import json

import cake_gdn_det_train.api as api
import numpy as np
import pytest
import torch
import torch.utils.checkpoint
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.linear_attention import inter_dtype
from cake_core.support import owned_nbytes
from cake_core.testing import (
    assert_bitwise_equal_named,
    assert_compiles_to_op,
    assert_raises_unmodified,
    bitwise_equal,
    leaf_grads,
    no_kernel_launches,
    randn,
)
from cake_core.triton_utils import default_device
from cake_gdn_det_train import (
    GDNDetPlan,
    GDNDetWorkspace,
    chunk_gated_delta_rule_det,
    chunk_gdn_det_bwd,
    chunk_gdn_det_fwd,
    is_supported,
    make_plan,
    saved_bytes,
)

DEV = default_device()
BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"
# packed: an empty document, then lengths 1, 63, 64 and 65
CU = (0, 0, 1, 64, 128, 193)
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log",
         "ddt_bias")


def _plans(K, V, dtype):
    base = make_plan(K, V, dtype, DEV)
    assert base.keep_states == 0
    return base, dataclasses.replace(base, keep_states=1)


def _leaves(gdn_inputs, B, T, H, HV, K, V, dtype, *, seed, n_states=None, gate=False):
    """q, k, v, g, beta, h0 (or None), A_log, dt_bias (None without the in-kernel gate)."""
    q, k, v, g, beta, h0 = gdn_inputs(B, T, H, HV, K, V, dtype, seed=seed, h0=True,
                                      n_states=n_states, normalize_k=not gate)
    A_log = dt_bias = None
    if gate:  # raw gate and pre-sigmoid beta
        g = 1.5 * randn((B, T, HV), torch.float32, DEV, seed=seed + 10)
        beta = 2.0 * randn((B, T, HV), torch.float32, DEV, seed=seed + 11)
        A_log = 0.5 * randn((HV,), torch.float32, DEV, seed=seed + 12) - 0.5
        dt_bias = 0.5 * randn((HV,), torch.float32, DEV, seed=seed + 13)
    return q, k, v, g, beta, h0, A_log, dt_bias


def _step_fn(plan, *, use_h0, use_dht, l2, gate, cu):
    def step(q, k, v, g, beta, h0, A_log, dt_bias):
        kw = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                  use_beta_sigmoid_in_kernel=True) if gate else {}
        o, ht = chunk_gated_delta_rule_det(
            q, k, v, g, beta, None, h0 if use_h0 else None, use_dht,
            use_qk_l2norm_in_kernel=l2, cu_seqlens=cu, plan=plan, **kw)
        loss = (o.float() * o.detach().float().cos()).sum()
        if not use_dht:
            return loss, o
        return loss + 0.1 * (ht * ht.detach().sin()).sum(), o, ht
    return step


# (B, T, H, HV, K, V, dtype, packed, initial state, dht, L2 norm + in-kernel gate)
CASES = [
    (2, 65, 2, 2, 16, 16, torch.float32, False, False, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True, True, True),
    (1, 130, 1, 2, 24, 16, torch.float32, False, True, True, False),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True, True, False),
    (1, 130, 1, 2, 32, 32, torch.bfloat16, False, False, False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_keep_states_same_bits_as_recompute(case, gdn_inputs, monkeypatch):
    B, T, H, HV, K, V, dtype, packed, use_h0, use_dht, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    leaves = _leaves(gdn_inputs, B, T, H, HV, K, V, dtype, seed=7 + T,
                     n_states=len(CU) - 1 if packed else None, gate=opts)
    redo, keep = _plans(K, V, dtype)
    args = dict(use_h0=use_h0, use_dht=use_dht, l2=opts, gate=opts, cu=cu)
    idx = [i for i, t in enumerate(leaves) if t is not None]
    present = [leaves[i] for i in idx]

    calls = []
    real = api._prep_and_state

    def spy(*a, **kw):
        calls.append(plan.keep_states)
        return real(*a, **kw)

    monkeypatch.setattr(api, "_prep_and_state", spy)

    def run(plan_):
        nonlocal plan
        plan = plan_
        step = _step_fn(plan, **args)

        def f(*xs):
            full = list(leaves)
            for i, x in zip(idx, xs, strict=True):
                full[i] = x
            return step(*full)
        return leaf_grads(f, present)

    plan = None
    want, got = run(redo), run(keep)
    # recompute: prep + recurrence in the forward and again in the backward; kept: forward
    assert calls == [0, 0, 1]
    names = ("o",) + (("final_state",) if use_dht else ()) + tuple(f"d{i}" for i in idx)
    for name, a, b in zip(names, got, want, strict=True):
        if name == "d5" and not use_h0:  # h0 given but not used
            assert a is None and b is None, name
            continue
        assert a is not None and b is not None, name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert bool(torch.isfinite(a.float()).all()), name
        assert bitwise_equal(a, b), f"{name}: keep_states=1 differs from 0"


def test_saved_set_holds_states_and_backward_skips_recompute(gdn_inputs, monkeypatch):
    K, V, dtype = 32, 32, torch.bfloat16
    q, k, v, g, beta, h0 = gdn_inputs(1, 193, 1, 2, K, V, dtype, seed=31, h0=True,
                                      n_states=len(CU) - 1)
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)
    redo, keep = _plans(K, V, dtype)
    do = randn(v.shape, dtype, DEV, seed=32)
    dht = randn(h0.shape, torch.float32, DEV, seed=33)
    NT, NC, HV = 193, 1 + 1 + 1 + 2, 2  # chunks: 0 + 1 + 1 + 1 + 2
    idt = inter_dtype(keep, dtype)
    assert idt == torch.bfloat16
    _, _, s0 = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                 cu_seqlens=cu, plan=redo)
    assert s0.h is None and s0.w is None and s0.v_new is None
    want = chunk_gdn_det_bwd(do, dht, s0)
    o1, ht1, s1 = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0,
                                    output_final_state=True, cu_seqlens=cu, plan=keep)
    assert s1.h.shape == (NC, HV, K, V) and s1.w.shape == (NT, HV, K)
    assert s1.v_new.shape == (NT, HV, V)
    assert {s1.h.dtype, s1.w.dtype, s1.v_new.dtype, s1.A.dtype} == {idt}
    assert s1.g_cumsum.dtype == torch.float32 and s1.g_cumsum.shape == (NT, HV)
    assert len(s1.tensors()) == len(s1.tensor_names) == 16 and s1.version == 2

    calls = []

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    def boom(*a, **kw):
        raise AssertionError("the backward recomputed the chunk states")

    real = api._prep_and_state
    monkeypatch.setattr(api, "_prep_and_state", boom)
    got = chunk_gdn_det_bwd(do, dht, s1)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got[:6], want[:6],
                          strict=True):
        assert bitwise_equal(a, b), name
    # the autograd entry keeps them too (through ctx.save_for_backward)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    monkeypatch.setattr(api, "_prep_and_state", real)
    o, ht = chunk_gated_delta_rule_det(*leaves[:5], initial_state=leaves[5],
                                       output_final_state=True, cu_seqlens=cu, plan=keep)
    monkeypatch.setattr(api, "_prep_and_state", boom)
    torch.autograd.backward([o, ht], [do, dht])
    for name, x, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves, want[:6],
                          strict=True):
        assert bitwise_equal(x.grad, b), name
    # another plan in the backward, or kept tensors that do not fit: recomputed, same bits
    monkeypatch.setattr(api, "_prep_and_state", spy)
    other = chunk_gdn_det_bwd(do, dht, s1, plan=redo)
    assert calls == [1]
    s1.meta["plan"] = redo
    assert api._kept_states(s1, keep, NT, NC, HV, K, V, idt, q.device) is None
    s1.meta["plan"] = keep
    s1._tensors["h"] = s1.h.float()
    again = chunk_gdn_det_bwd(do, dht, s1)
    assert calls == [1, 1]
    for a, b, c in zip(other[:6], again[:6], want[:6], strict=True):
        assert bitwise_equal(a, c) and bitwise_equal(b, c)


def test_two_forwards_then_backwards_in_reverse_one_workspace(gdn_inputs):
    # the kept tensors are the saved set's own: a second forward through the same workspace
    # does not overwrite the first's, so backwards in any order give the right gradients
    K, V, dtype, T = 16, 16, torch.float32, 100
    redo, keep = _plans(K, V, dtype)
    ws = GDNDetWorkspace.for_plan(keep, DEV, num_v_heads=2, max_tokens=T, dtype=dtype)
    ins = [gdn_inputs(1, T, 1, 2, K, V, dtype, seed=s, h0=True) for s in (41, 51)]
    dos = [randn((1, T, 2, V), dtype, DEV, seed=s) for s in (42, 52)]
    want = []
    for (q, k, v, g, beta, h0), do in zip(ins, dos, strict=True):
        _, _, s = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, plan=redo)
        want.append(chunk_gdn_det_bwd(do, None, s))
    saved = [chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, plan=keep,
                               workspace=ws)[2] for q, k, v, g, beta, h0 in ins]
    bufs = [ws[n] for n in ("w", "u", "v_new", "h")]
    for s in saved:
        for t in (s.h, s.w, s.v_new):
            lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
            for b in bufs:
                blo = b.data_ptr()
                bhi = blo + b.numel() * b.element_size()
                assert hi <= blo or lo >= bhi, "a kept tensor aliases the workspace"
    for i in (1, 0):
        got = chunk_gdn_det_bwd(dos[i], None, saved[i], workspace=ws)
        for a, b in zip(got[:6], want[i][:6], strict=True):
            assert bitwise_equal(a, b), i
    # autograd: two forwards, then the second's backward before the first's
    leaves = [[t.detach().clone().requires_grad_() for t in x] for x in ins]
    outs = [chunk_gated_delta_rule_det(*x[:5], initial_state=x[5], plan=keep)[0]
            for x in leaves]
    for i in (1, 0):
        outs[i].backward(dos[i])
        for x, b in zip(leaves[i], want[i][:6], strict=True):
            assert bitwise_equal(x.grad, b), i


def _compile_step(plan):
    def step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
        o, ht = chunk_gated_delta_rule_det(
            q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=True, plan=plan)
        return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht
    return step


def _compile_leaves(gdn_inputs):
    cu = (0, 0, 11, 80)
    return _leaves(gdn_inputs, 1, 80, 1, 2, 16, 16, torch.float32, seed=61,
                   n_states=len(cu) - 1, gate=True), torch.tensor(cu, device=DEV)


def test_compile_keep_states_plan_same_bits_as_eager(gdn_inputs):
    # the custom ops keep nothing beyond the inputs (they recompute T and the states): the
    # compiled keep_states = 1 plan gives the eager bits of both settings
    leaves, cu = _compile_leaves(gdn_inputs)
    redo, keep = _plans(16, 16, torch.float32)
    assert plan_from_op_fields(GDNDetPlan, plan_to_op_fields(keep)) == keep
    assert_compiles_to_op(_compile_step(keep), leaves, (cu,), NAMES, backend=BACKEND,
                          op="cake_gdn_det_train.fwd")
    assert_bitwise_equal_named(leaf_grads(_compile_step(keep), leaves, cu),
                               leaf_grads(_compile_step(redo), leaves, cu), NAMES,
                               "keep_states=1 differs from 0")


def test_checkpoint_keep_states(gdn_inputs):
    leaves, cu = _compile_leaves(gdn_inputs)
    redo, keep = _plans(16, 16, torch.float32)
    step = _compile_step(keep)

    def ckpt(*args):
        return torch.utils.checkpoint.checkpoint(step, *args, use_reentrant=False)

    assert_bitwise_equal_named(leaf_grads(ckpt, leaves, cu),
                               leaf_grads(_compile_step(redo), leaves, cu), NAMES,
                               "checkpointed keep_states=1 differs")


def test_plan_field_serialised_and_checked():
    redo, keep = _plans(32, 32, torch.bfloat16)
    for dev in ("cpu", "cuda"):
        for K, V, dt in ((16, 16, torch.float32), (128, 128, torch.bfloat16)):
            assert make_plan(K, V, dt, dev).keep_states == 0
    d = keep.to_dict()
    assert d["keep_states"] == 1 and d["version"] == 1
    assert GDNDetPlan.from_dict(d) == keep and keep.key != redo.key
    assert GDNDetPlan.from_dict(json.loads(keep.to_json())) == keep
    assert hash(keep) != hash(redo) and {keep: 1}[dataclasses.replace(redo, keep_states=1)]
    assert plan_from_op_fields(GDNDetPlan, plan_to_op_fields(keep)) == keep
    with pytest.raises(ValueError, match="missing .*keep_states"):
        GDNDetPlan.from_dict({n: x for n, x in redo.to_dict().items() if n != "keep_states"})
    for bad in (2, -1):
        with pytest.raises(ValueError, match="keep_states"):
            dataclasses.replace(redo, keep_states=bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        keep.keep_states = 0


# ----------------------------------------------------------------- FLA's disable_recompute


def _dr_run(leaves, cu, opts, monkeypatch, **kw):
    """``(outputs and leaf gradients, forward-recurrence runs)`` of one step of the entry
    on ``leaves`` (with their initial state and a final-state gradient), ``kw`` passed on
    (``plan``, ``disable_recompute``)."""
    calls = []
    real = api._prep_and_state
    monkeypatch.setattr(api, "_prep_and_state", lambda *a, **k: calls.append(1) or real(*a, **k))
    idx = [i for i, t in enumerate(leaves) if t is not None]

    def f(*xs):
        q, k, v, g, beta, h0, A_log, dt_bias = (
            dict(zip(idx, xs, strict=True)).get(i) for i in range(len(leaves)))
        gate = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                    use_beta_sigmoid_in_kernel=True) if opts else {}
        o, ht = chunk_gated_delta_rule_det(q, k, v, g, beta, None, h0, True,
                                           use_qk_l2norm_in_kernel=opts, cu_seqlens=cu,
                                           **gate, **kw)
        loss = (o.float() * o.detach().float().cos()).sum()
        return loss + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    got = leaf_grads(f, [leaves[i] for i in idx])
    monkeypatch.setattr(api, "_prep_and_state", real)
    return got, len(calls)


# (B, T, H, HV, K, V, dtype, packed, L2 norm + in-kernel gate)
DR_CASES = [
    (2, 65, 1, 2, 16, 16, torch.float32, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True),
]


@pytest.mark.parametrize("case", DR_CASES, ids=lambda c: "-".join(map(str, c)))
def test_disable_recompute_is_the_rules_plan_kept(case, gdn_inputs, monkeypatch):
    """disable_recompute=True: the call runs the plan it picks anyway (state_programs
    narrowing included) with keep_states = 1, made once; the backward recomputes nothing,
    and o, the final state and every gradient are bitwise those of the default call and of
    that plan given explicitly (with or without the flag)."""
    B, T, H, HV, K, V, dtype, packed, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    N = len(CU) - 1 if packed else B
    leaves = _leaves(gdn_inputs, B, T, H, HV, K, V, dtype, seed=5 + T, n_states=N, gate=opts)
    rule = api._resolve_plan(None, K, V, dtype, DEV, state_programs=N * HV)
    kept = api._resolve_plan(None, K, V, dtype, DEV, state_programs=N * HV,
                             disable_recompute=True)
    assert rule.keep_states == 0 and kept == dataclasses.replace(rule, keep_states=1)
    assert api._resolve_plan(None, K, V, dtype, DEV, state_programs=N * HV,
                             disable_recompute=True) is kept  # made once per plan
    want, n = _dr_run(leaves, cu, opts, monkeypatch)
    assert n == 2  # the forward's recurrence and the backward's recompute
    names = ["o", "final_state"] + [f"d{i}" for i, t in enumerate(leaves) if t is not None]
    for kw in (dict(disable_recompute=True), dict(plan=kept, disable_recompute=True),
               dict(plan=kept)):
        got, n = _dr_run(leaves, cu, opts, monkeypatch, **kw)
        assert n == 1, kw  # the forward's only: the backward read the kept states
        assert_bitwise_equal_named(got, want, names, f"{kw} differs from the default")


def test_disable_recompute_off_changes_nothing(gdn_inputs, monkeypatch):
    """disable_recompute off (FLA's default False, or None / 0: off by truthiness): the
    default call's bits, recompute and saved bytes."""
    cu = torch.tensor((0, 0, 1, 6, 70), dtype=torch.int32, device=DEV)
    leaves = _leaves(gdn_inputs, 1, 70, 1, 2, 16, 16, torch.bfloat16, seed=17, n_states=4,
                     gate=True)
    want, n = _dr_run(leaves, cu, True, monkeypatch)
    assert n == 2
    names = ["o", "final_state"] + [f"d{i}" for i in range(len(leaves))]
    q, k, v, g, beta = leaves[:5]
    for flag in (False, None, 0, np.False_):
        got, n = _dr_run(leaves, cu, True, monkeypatch, disable_recompute=flag)
        assert n == 2, flag
        assert_bitwise_equal_named(got, want, names, f"disable_recompute={flag!r} differs")
        assert saved_bytes(q, k, v, g, beta, cu_seqlens=cu, disable_recompute=flag) == \
            saved_bytes(q, k, v, g, beta, cu_seqlens=cu)


@pytest.mark.parametrize("dtype,cu", [(torch.float32, None),
                                      (torch.bfloat16, (0, 6, 70, 130))])
def test_disable_recompute_saved_set_keeps_the_states(dtype, cu, gdn_inputs):
    """The autograd graph of a disable_recompute call holds h, w and v_new, and saved_bytes
    counts them: what the call keeps, as much as with the keep_states = 1 plan, more than
    without; any truthy value counts as on (FLA tests the flag by truthiness)."""
    T, HV, K, V = 130, 2, 32, 16
    N = len(cu) - 1 if cu else 1
    q, k, v, g, beta, h0 = gdn_inputs(1, T, 1, HV, K, V, dtype, seed=23, h0=True,
                                      n_states=N)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, use_qk_l2norm_in_kernel=True)
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=DEV)
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        o, _ = chunk_gated_delta_rule_det(**kw, disable_recompute=True)
    h, w, v_new = o.grad_fn.saved_tensors[13:]  # (ctx.save_for_backward's order)
    NC = 3  # chunks: 130 tokens, or documents of 6, 64 and 60 tokens
    assert h.shape[0] >= NC and h.shape[1:] == (HV, K, V)
    assert w.shape == (T, HV, K) and v_new.shape == (T, HV, V)
    kept = dataclasses.replace(make_plan(K, V, dtype, DEV), keep_states=1)
    inputs = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    more = saved_bytes(**kw, disable_recompute=True)
    assert more == owned_nbytes(packed, exclude=inputs) == saved_bytes(**kw, plan=kept)
    assert more > saved_bytes(**kw)
    for flag in (1, np.True_, "yes"):  # FLA tests the flag by truthiness
        assert saved_bytes(**kw, disable_recompute=flag) == more, flag


def test_disable_recompute_with_a_recomputing_plan_refused(gdn_inputs):
    """disable_recompute on with a plan of keep_states = 0: ValueError saying what to pass,
    before any launch, nothing the caller owns modified; is_supported says it, saved_bytes
    raises it. A value without a truth value: ValueError too."""
    q, k, v, g, beta, _ = gdn_inputs(1, 70, 1, 2, 16, 16, torch.float32, seed=29)
    redo, keep = _plans(16, 16, torch.float32)
    base = dict(q=q, k=k, v=v, g=g, beta=beta)
    msg = (r"disable_recompute=True: the plan given has keep_states=0 .*pass a plan with "
           r"keep_states=1 \(dataclasses.replace\(plan, keep_states=1\)\) or drop "
           r"disable_recompute")
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd", "_l2norm"):
        for flag in (True, 1, np.True_):
            kw = dict(base, plan=redo, disable_recompute=flag)
            err = assert_raises_unmodified(chunk_gated_delta_rule_det, kw, msg)
            s = is_supported(**kw)
            assert not s and s.reason == str(err)
            with pytest.raises(ValueError, match=msg):
                saved_bytes(**kw)
        assert is_supported(**base, plan=keep, disable_recompute=True)
        assert is_supported(**base, plan=redo, disable_recompute=False)
        for bad in (np.array([True, False]), torch.ones(2)):
            assert_raises_unmodified(chunk_gated_delta_rule_det,
                                     dict(base, disable_recompute=bad),
                                     r"disable_recompute=.*expected a flag \(FLA tests it by "
                                     r"truthiness\)")


def test_compile_disable_recompute_same_bits_as_eager(gdn_inputs, monkeypatch):
    """Under torch.compile (fullgraph) disable_recompute reaches the custom op as the
    kept plan's fields: the op keeps the states (no recompute in the backward) and the
    bits are the eager default call's."""
    leaves, cu = _compile_leaves(gdn_inputs)

    def step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
        o, ht = chunk_gated_delta_rule_det(
            q, k, v, g, beta, 0.3, h0, True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=True, disable_recompute=True)
        return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    calls = []
    real = api._prep_and_state
    monkeypatch.setattr(api, "_prep_and_state", lambda *a, **k: calls.append(1) or real(*a, **k))
    compiled = assert_compiles_to_op(step, leaves, (cu,), NAMES, backend=BACKEND,
                                     op="cake_gdn_det_train.fwd")
    assert len(calls) == 2  # eager and compiled: one forward recurrence each
    assert_bitwise_equal_named(leaf_grads(compiled, leaves, cu),
                               leaf_grads(_compile_step(None), leaves, cu), NAMES,
                               "compiled disable_recompute differs from the default")
