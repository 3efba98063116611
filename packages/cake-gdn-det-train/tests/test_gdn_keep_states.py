"""plan.keep_states: the forward keeps the chunk states h, w, v_new (and g's cumsum) for the
backward, which then skips the chunk prep and the forward recurrence. Same bits as
keep_states = 0 (the backward's recompute runs the same kernels on the same inputs); the
kept tensors are the saved set's own (no workspace aliasing); serialisation; the custom-op
path (always recomputes) and checkpointing give the eager bits. FLA's disable_recompute:
the rule's plan with keep_states = 1 (a plan given must keep the states), off by
truthiness. The checks live in cake_core.testing (shared with KDA)."""

import dataclasses

import cake_gdn_det_train.api as api
import pytest
import torch
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.linear_attention import inter_dtype
from cake_core.testing import (
    assert_backward_reads_kept_states,
    assert_checkpoint_keep_states,
    assert_disable_recompute_calls,
    assert_disable_recompute_compiles,
    assert_keep_states_field_serialised,
    assert_keep_states_plan_compiles,
    assert_keep_states_same_bits,
    assert_kept_plan_resolved,
    assert_recomputing_plan_refused,
    assert_two_forwards_keep_their_states,
    disable_recompute_saved_states,
    keep_states_plans,
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
OP = "cake_gdn_det_train.fwd"
ENTRY = chunk_gated_delta_rule_det
# packed: an empty document, then lengths 1, 63, 64 and 65
CU = (0, 0, 1, 64, 128, 193)


def _plans(K, V, dtype):
    return keep_states_plans(make_plan(K, V, dtype, DEV))


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


# (B, T, H, HV, K, V, dtype, packed, initial state, dht, L2 norm + in-kernel gate)
CASES = [
    (2, 65, 2, 2, 16, 16, torch.float32, False, False, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True, True, True),
    (1, 130, 1, 2, 24, 16, torch.float32, False, True, True, False),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True, True, False),
    (1, 130, 1, 2, 32, 32, torch.bfloat16, False, False, False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_keep_states_same_bits_as_recompute(case, gdn_inputs):
    B, T, H, HV, K, V, dtype, packed, use_h0, use_dht, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    leaves = _leaves(gdn_inputs, B, T, H, HV, K, V, dtype, seed=7 + T,
                     n_states=len(CU) - 1 if packed else None, gate=opts)
    assert_keep_states_same_bits(ENTRY, api, leaves, _plans(K, V, dtype), cu=cu, opts=opts,
                                 use_h0=use_h0, use_dht=use_dht)


def test_saved_set_holds_states_and_backward_skips_recompute(gdn_inputs):
    K, V, dtype = 32, 32, torch.bfloat16
    inputs = gdn_inputs(1, 193, 1, 2, K, V, dtype, seed=31, h0=True, n_states=len(CU) - 1)
    redo, keep = _plans(K, V, dtype)
    NT, NC, HV = 193, 1 + 1 + 1 + 2, 2  # chunks: 0 + 1 + 1 + 1 + 2
    idt = inter_dtype(keep, dtype)
    assert idt == torch.bfloat16
    # another plan in the backward, or kept tensors that do not fit: recomputed, same bits
    s1, _ = assert_backward_reads_kept_states(
        chunk_gdn_det_fwd, chunk_gdn_det_bwd, ENTRY, api, inputs, (redo, keep),
        cu=torch.tensor(CU, dtype=torch.int64, device=DEV), seed=32,
        kept=dict(h=(NC, HV, K, V), w=(NT, HV, K), v_new=(NT, HV, V)), dtype=idt,
        kept_states=lambda s: api._kept_states(s, keep, NT, NC, HV, K, V, idt, DEV),
        other_plan=redo, spoil=("h", torch.float32))
    assert s1.g_cumsum.dtype == torch.float32 and s1.g_cumsum.shape == (NT, HV)
    assert len(s1.tensors()) == len(s1.tensor_names) == 16 and s1.version == 2


def test_two_forwards_then_backwards_in_reverse_one_workspace(gdn_inputs):
    # the kept tensors are the saved set's own: a second forward through the same workspace
    # does not overwrite the first's, so backwards in any order give the right gradients
    K, V, dtype, T = 16, 16, torch.float32, 100
    plans = _plans(K, V, dtype)
    ws = GDNDetWorkspace.for_plan(plans[1], DEV, num_v_heads=2, max_tokens=T, dtype=dtype)
    ins = [gdn_inputs(1, T, 1, 2, K, V, dtype, seed=s, h0=True) for s in (41, 51)]
    dos = [randn((1, T, 2, V), dtype, DEV, seed=s) for s in (42, 52)]
    assert_two_forwards_keep_their_states(chunk_gdn_det_fwd, chunk_gdn_det_bwd, ENTRY, ws, ins,
                                          dos, plans, kept=("h", "w", "v_new"),
                                          buffers=("w", "u", "v_new", "h"))


def _compile_leaves(gdn_inputs):
    cu = (0, 0, 11, 80)
    return _leaves(gdn_inputs, 1, 80, 1, 2, 16, 16, torch.float32, seed=61,
                   n_states=len(cu) - 1, gate=True), torch.tensor(cu, device=DEV)


def test_compile_keep_states_plan_same_bits_as_eager(gdn_inputs):
    # the custom ops keep nothing beyond the inputs (they recompute T and the states): the
    # compiled keep_states = 1 plan gives the eager bits of both settings
    leaves, cu = _compile_leaves(gdn_inputs)
    assert_keep_states_plan_compiles(ENTRY, _plans(16, 16, torch.float32), leaves, cu,
                                     backend=BACKEND, op=OP)


def test_checkpoint_keep_states(gdn_inputs):
    leaves, cu = _compile_leaves(gdn_inputs)
    assert_checkpoint_keep_states(ENTRY, _plans(16, 16, torch.float32), leaves, cu)


def test_plan_field_serialised_and_checked():
    redo, keep = _plans(32, 32, torch.bfloat16)
    assert_keep_states_field_serialised(make_plan, (redo, keep))
    assert plan_from_op_fields(GDNDetPlan, plan_to_op_fields(keep)) == keep
    with pytest.raises(ValueError, match="missing .*keep_states"):
        GDNDetPlan.from_dict({n: x for n, x in redo.to_dict().items() if n != "keep_states"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        keep.keep_states = 0


# ----------------------------------------------------------------- FLA's disable_recompute


# (B, T, H, HV, K, V, dtype, packed, L2 norm + in-kernel gate)
DR_CASES = [
    (2, 65, 1, 2, 16, 16, torch.float32, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True),
]


@pytest.mark.parametrize("case", DR_CASES, ids=lambda c: "-".join(map(str, c)))
def test_disable_recompute_is_the_rules_plan_kept(case, gdn_inputs):
    """disable_recompute=True: the call runs the plan it picks anyway (state_programs
    narrowing included) with keep_states = 1, made once; the backward recomputes nothing,
    and o, the final state and every gradient are bitwise those of the default call and of
    that plan given explicitly (with or without the flag)."""
    B, T, H, HV, K, V, dtype, packed, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    N = len(CU) - 1 if packed else B
    leaves = _leaves(gdn_inputs, B, T, H, HV, K, V, dtype, seed=5 + T, n_states=N, gate=opts)
    kept = assert_kept_plan_resolved(
        lambda **kw: api._resolve_plan(None, K, V, dtype, DEV, state_programs=N * HV, **kw))
    assert_disable_recompute_calls(ENTRY, api, leaves, cu=cu, l2=opts, gate=opts,
                                   on=(dict(disable_recompute=True),
                                       dict(plan=kept, disable_recompute=True),
                                       dict(plan=kept)))


def test_disable_recompute_off_changes_nothing(gdn_inputs):
    """disable_recompute off (FLA's default False, or None / 0: off by truthiness): the
    default call's bits, recompute and saved bytes."""
    cu = torch.tensor((0, 0, 1, 6, 70), dtype=torch.int32, device=DEV)
    leaves = _leaves(gdn_inputs, 1, 70, 1, 2, 16, 16, torch.bfloat16, seed=17, n_states=4,
                     gate=True)
    assert_disable_recompute_calls(ENTRY, api, leaves, cu=cu, l2=True, gate=True, off=True,
                                   saved_bytes=saved_bytes)


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
    h, w, v_new = disable_recompute_saved_states(ENTRY, saved_bytes, kw,
                                                 _plans(K, V, dtype)[1])
    NC = 3  # chunks: 130 tokens, or documents of 6, 64 and 60 tokens
    assert h.shape[0] >= NC and h.shape[1:] == (HV, K, V)
    assert w.shape == (T, HV, K) and v_new.shape == (T, HV, V)


def test_disable_recompute_with_a_recomputing_plan_refused(gdn_inputs):
    """disable_recompute on with a plan of keep_states = 0: ValueError saying what to pass,
    before any launch, nothing the caller owns modified; is_supported says it, saved_bytes
    raises it. A value without a truth value: ValueError too."""
    q, k, v, g, beta, _ = gdn_inputs(1, 70, 1, 2, 16, 16, torch.float32, seed=29)
    assert_recomputing_plan_refused(ENTRY, is_supported, saved_bytes, api,
                                    dict(q=q, k=k, v=v, g=g, beta=beta),
                                    make_plan(16, 16, torch.float32, DEV))


def test_compile_disable_recompute_same_bits_as_eager(gdn_inputs):
    """Under torch.compile (fullgraph) disable_recompute reaches the custom op as the
    kept plan's fields: the op keeps the states (no recompute in the backward) and the
    bits are the eager default call's."""
    leaves, cu = _compile_leaves(gdn_inputs)
    assert_disable_recompute_compiles(ENTRY, api, leaves, cu, backend=BACKEND, op=OP)
