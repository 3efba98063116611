"""Edge cases of the chunk kernels (the pair products of each 64-token chunk and their
gradients in kernels per 16-token sub-chunk and per token), as a user of FLA's
``chunk_kda`` meets them: K and V tiny, odd or at the limit, K != V, GVA with several q/k
heads, lengths around the 16-token sub-chunk and the 64-token chunk, packed documents that
are empty or one token long, no tokens at all, fp16 / bf16, non-contiguous inputs,
gradients to a subset of the inputs, a second backward through a retained graph,
``torch.utils.checkpoint`` and a workspace reused across lengths. Against float64 through
the reference (``conftest.check_vs_reference``) or bitwise against the plain call.

Two known limits are kept as strict xfails: the within-chunk cumulative decay is an fp32
running sum (as in FLA), so a very large decay early in a chunk followed by small ones
loses the small differences to rounding; and bf16 with the q/k L2 norm and the other
in-kernel options puts o just past bf16's tolerance with the rule's 16-bit intermediates
(within it with ``store_16bit = 0``)."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, bitwise_equal, poison_, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetWorkspace,
    chunk_kda_det,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    kda_recurrence_ref,
    make_plan,
)

DEV = default_device()
F32 = torch.float32


@pytest.mark.parametrize("B, T, H, HV, K, V, dtype, opts", [
    (1, 17, 1, 1, 1, 1, F32, {}),
    (2, 16, 1, 1, 3, 5, F32, dict(with_dht=False)),
    (1, 33, 1, 2, 17, 2, F32, {}),
    (1, 20, 2, 4, 16, 16, F32, {}),
    (1, 17, 1, 1, 256, 256, F32, {}),
    (1, 40, 1, 1, 32, 48, torch.float16, {}),
    (1, 20, 1, 1, 5, 3, torch.bfloat16, {}),
], ids=["K1V1-T17", "K3V5-B2-T16-nodht", "K17V2-HV2-T33", "H2-HV4", "K256V256",
        "fp16-K32V48", "bf16-K5V3"])
def test_odd_head_dims_vs_reference(B, T, H, HV, K, V, dtype, opts, kda):
    """Head dims 1, 2, 3, 5, 17, 48 and 256 (masked key blocks and V columns of the
    sub-chunk kernels), K != V, two q/k heads of two value heads each; the rule's plan
    against float64."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(B, T, H, HV, K, V, dtype, seed=K + V, h0=True)
    if DEV.type == "cuda" and max(K, V) > 128:  # CUDA builds tiles up to 128 only
        with pytest.raises(ValueError, match=r"on CUDA K and V must be <= 128"):
            make_plan(K, V, dtype, DEV)
        return
    plan = make_plan(K, V, dtype, DEV)
    kda.check_vs_reference((q, k, v, g, beta), h0, dtype=dtype, seed=K + V, plan=plan,
                           **opts)


def test_packed_sub_chunk_edges_vs_reference(kda):
    """Documents that are empty, one token, or end exactly at / one past / one before a
    16-token sub-chunk or one past the 64-token chunk, strong per-channel decays."""
    lens = [0, 1, 16, 17, 0, 15, 65, 1]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 1, 16, 16, seed=81,
                                               g_mode="strong", n_states=len(lens), h0=True)
    kda.check_vs_reference((q, k, v, g, beta), h0, seed=81, cu_seqlens=kda.cu_of(lens))


def _every_option_bf16(kda):
    """bf16, K = 33 != V = 20 (masked blocks), H = 2 q/k heads of two value heads, packed
    17/0/9/1, q/k L2 norm, gate with A_log, dt_bias and a lower bound (safe_gate), beta
    sigmoid with allow_neg_eigval, an initial state: ``(inputs, h0, A_log, dt_bias, kw)``."""
    lens = [17, 0, 9, 1]
    K, V = 33, 20
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 2, 4, K, V, torch.bfloat16,
                                               seed=2, normalize_k=False, g_mode="raw",
                                               raw_beta=True, n_states=len(lens), h0=True)
    A_log, dt_bias = kda.make_gate_params(4, K, seed=3)
    kw = dict(cu_seqlens=kda.cu_of(lens), use_qk_l2norm_in_kernel=True,
              use_gate_in_kernel=True, lower_bound=-4.0, safe_gate=True,
              use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    return (q, k, v, g, beta), h0, A_log, dt_bias, kw


def test_every_option_bf16_gva_packed_fp32_intermediates_vs_reference(kda):
    """:func:`_every_option_bf16` with fp32 intermediates
    (``store_16bit = 0``): o, final state and every gradient within bf16's tolerance (the
    rule's 16-bit intermediates: the xfail below)."""
    inputs, h0, A_log, dt_bias, kw = _every_option_bf16(kda)
    plan = dataclasses.replace(make_plan(33, 20, torch.bfloat16, DEV), store_16bit=0)
    kda.check_vs_reference(inputs, h0, A_log, dt_bias, dtype=torch.bfloat16, seed=2,
                           plan=plan, **kw)


@pytest.mark.xfail(strict=DEV.type != "cuda", raises=AssertionError, reason=(
    "precision limit of the rule's 16-bit intermediates (store_16bit=1, as FLA): "
    "bf16 with the q/k L2 norm (normalised q/k stored in bf16, as FLA) and the other "
    "in-kernel options puts o 1.6-1.7e-2 off float64 on seeds 1, 2 and 83 (tolerance "
    "1.6e-2; 0.9e-2 with store_16bit=0; the gradients stay under 1e-2); strict under the "
    "interpreter only: on an H200 the compiled kernels' rounding passed (2026-11-30)"))
def test_every_option_bf16_rule_plan_o_within_bf16_tolerance(kda):
    inputs, h0, A_log, dt_bias, kw = _every_option_bf16(kda)
    assert make_plan(33, 20, torch.bfloat16, DEV).store_16bit == 1
    with torch.no_grad():
        o, _ = chunk_kda_det(*inputs, initial_state=h0, A_log=A_log, dt_bias=dt_bias, **kw)
        ref_kw = {n: x for n, x in kw.items() if n != "safe_gate"}
        o_r, _ = kda_recurrence_ref(*(t.double() for t in inputs), initial_state=h0.double(),
                                    A_log=A_log.double(), dt_bias=dt_bias.double(),
                                    dtype=torch.float64, **ref_kw)
    assert_close_to_reference(o, o_r, torch.bfloat16, "o")


@pytest.mark.parametrize("packed", [False, True], ids=["B2-T0", "packed-all-empty"])
def test_no_tokens(packed, kda):
    """No tokens at all: o is empty, each final state is its initial state and its gradient
    is dht, bitwise (the reference has no graph to compare against here)."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1 if packed else 2, 0, 1, 2, 16, 16, seed=85,
                                               n_states=3 if packed else None, h0=True)
    cu = kda.cu_of([0, 0, 0]) if packed else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, ht = chunk_kda_det(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                          cu_seqlens=cu)
    assert o.shape == v.shape and bitwise_equal(ht, h0)
    dht = randn(h0.shape, F32, DEV, seed=86)
    torch.autograd.backward([o, ht], [torch.zeros_like(o), dht])
    assert bitwise_equal(leaves[5].grad, dht)
    for t, x in zip(leaves[:5], (q, k, v, g, beta), strict=True):
        assert t.grad is not None and t.grad.shape == x.shape


def _grads(inputs, mask, do, dht, **kw):
    leaves = [t.detach().clone().requires_grad_(bool(m)) for t, m in zip(inputs, mask,
                                                                         strict=True)]
    o, ht = chunk_kda_det(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                          **kw)
    torch.autograd.backward([o, ht], [do, dht])
    return [o.detach(), ht.detach()] + [t.grad for t in leaves]


def test_non_contiguous_inputs_and_upstream_grads_same_bits(kda):
    """Every input and both upstream gradients given with transposed strides (and v, beta
    as strided slices) give the contiguous call's bits: the entry copies, never misreads."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 20, 1, 2, 16, 16, seed=87, h0=True)
    do = randn(v.shape, F32, DEV, seed=88)
    dht = randn(h0.shape, F32, DEV, seed=89)
    want = _grads((q, k, v, g, beta, h0), [1] * 6, do, dht)

    def transposed(t):
        return t.transpose(0, -1).contiguous().transpose(0, -1)

    def strided(t):
        big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        return big[..., ::2]

    ins = [transposed(q), transposed(k), strided(v), transposed(g), strided(beta),
           transposed(h0)]
    assert not any(t.is_contiguous() for t in ins)
    got = _grads(ins, [1] * 6, transposed(do), transposed(dht))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert bitwise_equal(a, b), i


def test_grads_of_a_subset_of_inputs(kda):
    """Only some inputs require grad: theirs are the full call's bits, the others None."""
    inputs = kda.make_kda_inputs(1, 20, 1, 1, 16, 16, seed=90, h0=True)
    do = randn(inputs[2].shape, F32, DEV, seed=91)
    dht = randn(inputs[5].shape, F32, DEV, seed=92)
    full = _grads(inputs, [1] * 6, do, dht)
    for mask in ([0, 0, 1, 0, 0, 0], [1, 0, 0, 1, 1, 1]):
        got = _grads(inputs, mask, do, dht)
        for m, a, b in zip(mask, got[2:], full[2:], strict=True):
            assert bitwise_equal(a, b) if m else a is None, mask


def test_second_backward_through_retained_graph_same_bits(kda):
    """``retain_graph=True``: a second backward reads the same saved tensors (the
    backward must not write into the saved G or T) and gives the same bits."""
    lens = [20, 0, 5]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 1, 16, 16, seed=93,
                                               n_states=3, h0=True)
    plan = make_plan(16, 16, F32, DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, ht = chunk_kda_det(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                          cu_seqlens=kda.cu_of(lens), plan=plan)
    ups = [randn(o.shape, F32, DEV, seed=94), randn(ht.shape, F32, DEV, seed=95)]
    first = torch.autograd.grad([o, ht], leaves, ups, retain_graph=True)
    again = torch.autograd.grad([o, ht], leaves, ups)
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        assert bitwise_equal(a, b), i


def test_checkpoint_same_bits(kda):
    from torch.utils.checkpoint import checkpoint

    inputs = kda.make_kda_inputs(1, 17, 1, 1, 16, 16, seed=96, h0=True)
    do = randn(inputs[2].shape, F32, DEV, seed=97)
    dht = randn(inputs[5].shape, F32, DEV, seed=98)

    def fn(*a):
        return chunk_kda_det(*a[:5], initial_state=a[5], output_final_state=True)

    out = []
    for ck in (False, True):
        leaves = [t.clone().requires_grad_() for t in inputs]
        o, ht = checkpoint(fn, *leaves, use_reentrant=False) if ck else fn(*leaves)
        torch.autograd.backward([o, ht], [do, dht])
        out.append([o, ht] + [t.grad for t in leaves])
    for i, (a, b) in enumerate(zip(*out, strict=True)):
        assert bitwise_equal(a, b), i


def test_workspace_reused_across_lengths_same_bits(kda):
    """One workspace serves a call of 20/5 tokens, then (poisoned with NaN) a shorter one of
    1/0/3 tokens (fewer chunks than it holds), forward and backward: the shorter call gives
    the same bits as without a workspace."""
    plan = make_plan(16, 16, F32, DEV)
    ws = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=1, max_tokens=32, max_seqs=3)

    def run(lens, w):
        q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 1, 16, 16,
                                                   seed=sum(lens), n_states=len(lens), h0=True)
        o, ht, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0,
                                         output_final_state=True, cu_seqlens=kda.cu_of(lens),
                                         plan=plan, workspace=w)
        do = randn(v.shape, F32, DEV, seed=1)
        dht = randn(h0.shape, F32, DEV, seed=2)
        return [o, ht, *chunk_kda_det_bwd(do, dht, saved, workspace=w)]

    run([20, 5], ws)
    for name in ws.names:
        poison_(ws[name])
    want = run([1, 0, 3], None)
    for i, (a, b) in enumerate(zip(run([1, 0, 3], ws), want, strict=True)):
        assert bitwise_equal(a, b), i


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "known limit, FLA alike: the within-chunk "
    "cumulative decay G is an fp32 running sum, so after a decay of -500 at a chunk's "
    "first token the later tokens' differences G_i - G_j (about -1e-3 per token) carry "
    "the rounding of |G| ~ 500 (ulp 3e-5): o, the final state and the gradients are "
    "~1e-4 off float64 (tolerance 1e-5)"))
def test_large_decay_then_small_decays_fp32_limit(kda):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 1, 1, 16, 16, seed=102, h0=True)
    g = torch.full_like(g, -1e-3)
    g[:, ::64] = -500.0   # a near-reset at each chunk's first token, then near-1 decays
    plan = make_plan(16, 16, F32, DEV)
    kda.check_vs_reference((q, k, v, g, beta), h0, seed=102, plan=plan)
