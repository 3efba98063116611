"""plan.keep_states: the forward keeps the chunk states h, w, kg and v_new for the backward,
which then skips the chunk prep and the forward state pass. Same bits as keep_states = 0
(the backward's recompute runs the same kernels on the same inputs); the kept tensors are
the saved set's own (no workspace aliasing); a backward with another plan, or with kept
tensors that do not fit, recomputes; the custom ops under torch.compile and checkpointing
give the eager bits; the plan field serialises. FLA's disable_recompute: the rule's plan
with keep_states = 1 (a plan given must keep the states), off by truthiness. The checks
live in cake_core.testing (shared with GDN)."""

import dataclasses

import cake_kda_det_train.api as api
import cake_kda_det_train.chunk as chunk
import pytest
import torch
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
from cake_kda_det_train import (
    KDADetPlan,
    KDADetWorkspace,
    chunk_kda_det,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    is_supported,
    make_plan,
    saved_bytes,
)

DEV = default_device()
BACKEND = "aot_eager" if DEV.type == "cpu" else "inductor"
OP = "cake_kda_det_train.fwd"
# packed: an empty document, then lengths 1, 63, 64 and 65
CU = (0, 0, 1, 64, 128, 193)


def _plans(K, V, dtype):
    return keep_states_plans(make_plan(K, V, dtype, DEV))


def _leaves(kda, B, T, H, HV, K, V, dtype, *, seed, n_states=None, gate=False):
    """q, k, v, g, beta, h0, A_log, dt_bias (the last two None without the in-kernel gate:
    then g is the log decay and beta post-sigmoid)."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(B, T, H, HV, K, V, dtype, seed=seed, h0=True,
                                               n_states=n_states, normalize_k=not gate,
                                               g_mode="raw" if gate else "real",
                                               raw_beta=gate)
    A_log = dt_bias = None
    if gate:
        A_log, dt_bias = kda.make_gate_params(HV, K, seed=seed + 10)
    return q, k, v, g, beta, h0, A_log, dt_bias


# (B, T, H, HV, K, V, dtype, packed, initial state, dht, L2 norm + in-kernel gate + sigmoid)
CASES = [
    (2, 65, 2, 2, 16, 16, torch.float32, False, False, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True, True, True),
    (1, 130, 1, 2, 24, 16, torch.float32, False, True, True, False),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True, True, True),
    (1, 130, 1, 2, 32, 32, torch.bfloat16, False, False, False, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_keep_states_same_bits_as_recompute(case, kda):
    B, T, H, HV, K, V, dtype, packed, use_h0, use_dht, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    leaves = _leaves(kda, B, T, H, HV, K, V, dtype, seed=7 + T,
                     n_states=len(CU) - 1 if packed else None, gate=opts)
    assert_keep_states_same_bits(chunk_kda_det, chunk, leaves, _plans(K, V, dtype), cu=cu,
                                 opts=opts, use_h0=use_h0, use_dht=use_dht)


def test_saved_set_holds_states_and_backward_skips_recompute(kda):
    K, V, dtype = 32, 32, torch.bfloat16
    inputs = kda.make_kda_inputs(1, 193, 1, 2, K, V, dtype, seed=31, h0=True,
                                 n_states=len(CU) - 1)
    redo, keep = _plans(K, V, dtype)
    NT, NC, HV = 193, 0 + 1 + 1 + 1 + 2, 2
    idt = inter_dtype(keep, dtype)
    # a backward plan that differs only in keep_states: the same launches, the kept states;
    # a plan with other launches, or kept tensors that do not fit (kg in a dtype no plan
    # keeps): recomputed
    kept = dict(h=(NC, HV, K, V), w=(NT, HV, K), kg=(NT, HV, K), v_new=(NT, HV, V))
    s1, saved = assert_backward_reads_kept_states(
        chunk_kda_det_fwd, chunk_kda_det_bwd, chunk_kda_det, chunk, inputs, (redo, keep),
        cu=torch.tensor(CU, dtype=torch.int64, device=DEV), seed=32, kept=kept, dtype=idt,
        kept_states=lambda s: api._kept_states(s, keep, NT, NC, HV, K, V, idt, DEV),
        other_plan=dataclasses.replace(redo, num_warps_prep=8 if redo.num_warps_prep == 4
                                       else 4),
        spoil=("kg", torch.float64), same_plan=redo)
    assert len(s1.tensors()) == len(s1.tensor_names) == 17 and s1.version == 2
    # the autograd entry keeps them too, eagerly h with one row per chunk (under
    # torch.compile the most chunks 5 sequences of 193 tokens can form: 7)
    assert saved == list(kept.values())


def test_two_forwards_then_backwards_in_reverse_one_workspace(kda):
    # the kept tensors are the saved set's own: a second forward through the same workspace
    # does not overwrite the first's, so backwards in any order give the right gradients
    K, V, dtype, T = 16, 16, torch.float32, 100
    plans = _plans(K, V, dtype)
    ws = KDADetWorkspace.for_plan(plans[1], DEV, num_v_heads=2, max_tokens=T, dtype=dtype)
    ins = [kda.make_kda_inputs(1, T, 1, 2, K, V, dtype, seed=s, h0=True) for s in (41, 51)]
    dos = [randn((1, T, 2, V), dtype, DEV, seed=s) for s in (42, 52)]
    assert_two_forwards_keep_their_states(chunk_kda_det_fwd, chunk_kda_det_bwd, chunk_kda_det,
                                          ws, ins, dos, plans, kept=("h", "w", "kg", "v_new"),
                                          buffers=("w", "u", "v_new", "h", "aqk"))


def _compile_leaves(kda):
    cu = (0, 0, 11, 80)
    return _leaves(kda, 1, 80, 1, 2, 16, 16, torch.float32, seed=61, n_states=len(cu) - 1,
                   gate=True), torch.tensor(cu, device=DEV)


def test_compile_keep_states_plan_same_bits_as_eager(kda):
    leaves, cu = _compile_leaves(kda)
    assert_keep_states_plan_compiles(chunk_kda_det, _plans(16, 16, torch.float32), leaves, cu,
                                     backend=BACKEND, op=OP)


def test_checkpoint_keep_states(kda):
    leaves, cu = _compile_leaves(kda)
    assert_checkpoint_keep_states(chunk_kda_det, _plans(16, 16, torch.float32), leaves, cu)


def test_saved_bytes_counts_the_kept_states(kda):
    """saved_bytes with keep_states = 1 adds h (a row per chunk: 3 here, where 3 sequences
    of 130 tokens could form 4), w, kg and v_new in the intermediates' dtype."""
    K, V, dtype = 32, 16, torch.bfloat16
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 130, 1, 2, K, V, dtype, seed=71)
    cu = torch.tensor((0, 64, 128, 130), dtype=torch.int32, device=DEV)
    redo, keep = _plans(K, V, dtype)
    base = saved_bytes(q, k, v, g, beta, cu_seqlens=cu, plan=redo)
    more = saved_bytes(q, k, v, g, beta, cu_seqlens=cu, plan=keep)
    es = inter_dtype(keep, dtype).itemsize
    rows = 3
    assert more - base == es * (rows * 2 * K * V + 130 * 2 * (2 * K + V))


def test_plan_field_serialised_and_checked():
    redo, keep = _plans(32, 32, torch.bfloat16)
    assert_keep_states_field_serialised(make_plan, (redo, keep))
    d = keep.to_dict()
    d.pop("keep_states")
    assert KDADetPlan.from_dict(d) == redo  # a dict without the field loads it as 0


# ----------------------------------------------------------------- FLA's disable_recompute


# (B, T, H, HV, K, V, dtype, packed, L2 norm + in-kernel gate + sigmoid)
DR_CASES = [
    (2, 65, 1, 2, 16, 16, torch.float32, False, False),
    (1, 193, 1, 2, 16, 16, torch.float32, True, True),
    (1, 193, 2, 2, 32, 32, torch.bfloat16, True, True),
]


@pytest.mark.parametrize("case", DR_CASES, ids=lambda c: "-".join(map(str, c)))
def test_disable_recompute_is_the_rules_plan_kept(case, kda):
    """disable_recompute=True: the call runs the plan it picks anyway with keep_states = 1,
    made once; the backward recomputes nothing, and o, the final state and every gradient
    are bitwise those of the default call and of that plan given explicitly (with or without
    the flag)."""
    B, T, H, HV, K, V, dtype, packed, opts = case
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    N = len(CU) - 1 if packed else B
    leaves = _leaves(kda, B, T, H, HV, K, V, dtype, seed=5 + T, n_states=N, gate=opts)
    kept = assert_kept_plan_resolved(lambda **kw: api._resolve_plan(None, K, V, dtype, DEV,
                                                                     **kw))
    assert_disable_recompute_calls(chunk_kda_det, chunk, leaves, cu=cu, l2=opts, gate=opts,
                                   on=(dict(disable_recompute=True),
                                       dict(plan=kept, disable_recompute=True),
                                       dict(plan=kept)))


def test_disable_recompute_off_changes_nothing(kda):
    """disable_recompute off (FLA's default False, or None / 0: off by truthiness): the
    default call's bits, recompute and saved bytes."""
    cu = torch.tensor((0, 0, 1, 6, 70), dtype=torch.int32, device=DEV)
    leaves = _leaves(kda, 1, 70, 1, 2, 16, 16, torch.bfloat16, seed=17, n_states=4,
                     gate=True)
    assert_disable_recompute_calls(chunk_kda_det, chunk, leaves, cu=cu, l2=True, gate=True,
                                   off=True, saved_bytes=saved_bytes)


@pytest.mark.parametrize("dtype,cu", [(torch.float32, None),
                                      (torch.bfloat16, (0, 6, 70, 130))])
def test_disable_recompute_saved_set_keeps_the_states(dtype, cu, kda):
    """The autograd graph of a disable_recompute call holds h (a row per chunk), w, kg and
    v_new, and saved_bytes counts them: what the call keeps, as much as with the
    keep_states = 1 plan, more than without; any truthy value counts as on (FLA tests the
    flag by truthiness)."""
    T, HV, K, V = 130, 2, 32, 16
    N = len(cu) - 1 if cu else 1
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, T, 1, HV, K, V, dtype, seed=23, h0=True,
                                               n_states=N)
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, use_qk_l2norm_in_kernel=True)
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32, device=DEV)
    kept = disable_recompute_saved_states(chunk_kda_det, saved_bytes, kw,
                                          _plans(K, V, dtype)[1])
    NC = 3  # chunks: 130 tokens, or documents of 6, 64 and 60 tokens
    assert [tuple(t.shape) for t in kept] == [(NC, HV, K, V), (T, HV, K), (T, HV, K),
                                              (T, HV, V)]  # h, w, kg, v_new


def test_disable_recompute_with_a_recomputing_plan_refused(kda):
    """disable_recompute on with a plan of keep_states = 0: ValueError saying what to pass,
    before any launch, nothing the caller owns modified; is_supported says it, saved_bytes
    raises it. A value without a truth value: ValueError too."""
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 70, 1, 2, 16, 16, torch.float32, seed=29)
    assert_recomputing_plan_refused(chunk_kda_det, is_supported, saved_bytes, api,
                                    dict(q=q, k=k, v=v, g=g, beta=beta),
                                    make_plan(16, 16, torch.float32, DEV))


def test_compile_disable_recompute_same_bits_as_eager(kda):
    """Under torch.compile (fullgraph) disable_recompute reaches the custom op as the
    kept plan's fields: the op keeps the states (no recompute in the backward) and the
    bits are the eager default call's."""
    leaves, cu = _compile_leaves(kda)
    assert_disable_recompute_compiles(chunk_kda_det, chunk, leaves, cu, backend=BACKEND, op=OP)
