"""o, final_state and EVERY gradient (q, k, v, g, beta, initial_state, A_log, dt_bias)
against float64 autograd through the token-by-token reference, on fresh random inputs:
fixed length and packed (empty, 1, 17, 63, 64 and 129-token documents), with and
without an initial state, the L2 norm, both in-kernel gate formulas, the beta sigmoid,
each dtype, GVA (HV = 2H), K != V, strong per-channel decays."""

import pytest
import torch
from cake_core.testing import bitwise_equal
from cake_core.triton_utils import default_device
from cake_kda_det_train import chunk_kda_det, chunk_kda_det_bwd, chunk_kda_det_fwd

DEV = default_device()


@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "zero-state"])
def test_packed_edge_lengths(with_h0, kda):
    # documents that end one token before, at and one token after a chunk boundary (the
    # 129-token one after the second: three chunks), empty, one token long, and one across
    # a sub-chunk boundary
    lens = [0, 1, 63, 129] if with_h0 else [64, 0, 1, 17]
    cu = kda.cu_of(lens)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 2, 16, 16, seed=3,
                                           n_states=len(lens), h0=with_h0)
    _, ht, _ = kda.check_vs_reference((q, k, v, g, beta), h0, seed=3, cu_seqlens=cu,
                                      outputs=True)
    if with_h0:  # an empty document hands back its initial state unchanged (bitwise)
        assert bitwise_equal(ht[0], h0[0])


def test_l2norm_gva_k_ne_v_int64_offsets(kda):
    """HV = 2H with two q/k heads, K = 32 != V = 16, unnormalised q/k through the
    in-kernel L2 norm, packed with int64 offsets, no final state gradient."""
    lens = [40, 30]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 2, 4, 32, 16, seed=5, normalize_k=False,
                                           n_states=2, h0=True)
    kda.check_vs_reference((q, k, v, g, beta), h0, seed=5, with_dht=False,
                       cu_seqlens=kda.cu_of(lens, torch.int64), use_qk_l2norm_in_kernel=True)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an exp overflow in the interpreter
def test_strong_per_channel_decays(kda):
    """g down to -20 per token and channel (the state nearly resets along some channels
    while others remember): finite everywhere, within fp32 tolerance."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 1, 2, 32, 32, seed=7, g_mode="strong",
                                           h0=True)
    assert float(g.min()) < -19.0
    got = kda.check_vs_reference((q, k, v, g, beta), h0, seed=7)
    assert all(bool(torch.isfinite(t).all()) for t in got if t is not None)


# fixed length (B = 2) with an initial state and dht: test_gate_softplus_bias_and_beta_sigmoid
# (the in-kernel gate only forms g); without them: test_near_one_decays_scale
def test_near_one_decays_scale(kda):
    q, k, v, g, beta, _ = kda.make_kda_inputs(2, 65, 1, 1, 16, 32, seed=9, g_mode="near0")
    kda.check_vs_reference((q, k, v, g, beta), None, seed=9, scale=0.3)


def test_gate_softplus_bias_and_beta_sigmoid(kda):
    """FLA's default gate -exp(A_log) softplus(g + dt_bias) with raw g crossing the
    softplus threshold (20) and far below 0, and the in-kernel beta sigmoid."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(2, 70, 1, 2, 16, 16, seed=11, g_mode="raw",
                                           raw_beta=True, h0=True)
    g[0, 1, 0, :4] = 25.0
    g[0, 2, 1, 3] = -30.0
    g[1, 3, 0, 5] = 19.9
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=12)
    kda.check_vs_reference((q, k, v, g, beta), h0, A_log, dt_bias, seed=11,
                       use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def test_gate_lower_bound_with_A_log_packed_neg_eigval(kda):
    """lower_bound * sigmoid(exp(A_log) (g + dt_bias)), packed, beta' = 2 sigmoid(beta)."""
    lens = [20, 0, 17]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 37, 1, 2, 16, 16, seed=13, g_mode="raw",
                                           raw_beta=True, n_states=3, h0=True)
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=14)
    kda.check_vs_reference((q, k, v, g, beta), h0, A_log, dt_bias, seed=13,
                           cu_seqlens=kda.cu_of(lens), use_gate_in_kernel=True,
                           lower_bound=-3.0, use_beta_sigmoid_in_kernel=True,
                           allow_neg_eigval=True)


def test_gate_lower_bound_without_A_log_safe_gate(kda):
    """A_log = None with lower_bound: lower_bound * sigmoid(g), no dt_bias; safe_gate
    (accepted, lower_bound in [-5, 0)) changes nothing."""
    q, k, v, g, beta, _ = kda.make_kda_inputs(1, 20, 1, 2, 16, 16, seed=15, g_mode="raw")
    o1, _, got = kda.check_vs_reference((q, k, v, g, beta), None, None, None, seed=15,
                                        use_gate_in_kernel=True, lower_bound=-5.0,
                                        safe_gate=True, outputs=True)
    assert got[6] is None and got[7] is None
    o2, _, _ = chunk_kda_det_fwd(q, k, v, g, beta, use_gate_in_kernel=True, lower_bound=-5.0)
    assert bitwise_equal(o1, o2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_inputs(dtype, kda):
    """bf16: K = V = 64, HV = 2H, g and beta in bf16 too; fp16: K = V = 32, two q/k heads,
    every in-kernel option, A_log and dt_bias in fp16."""
    if dtype == torch.bfloat16:
        q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 1, 2, 64, 64, dtype, seed=17, h0=True,
                                               gb_dtype=dtype)
        kda.check_vs_reference((q, k, v, g, beta), h0, dtype=dtype, seed=17)
    else:
        q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 70, 2, 4, 32, 32, dtype, seed=19, h0=True,
                                               g_mode="raw", raw_beta=True, normalize_k=False)
        A_log, dt_bias = kda.make_gate_params(4, 32, seed=20, dtype=dtype)
        kda.check_vs_reference((q, k, v, g, beta), h0, A_log, dt_bias, dtype=dtype, seed=19,
                           use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                           use_beta_sigmoid_in_kernel=True)


def test_low_level_equals_autograd_bitwise(kda):
    """chunk_kda_det_fwd / _bwd give the autograd entry's bits (every option on; both entries
    launch the same kernels, so 20 tokens show it)."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 20, 1, 2, 16, 16, seed=21, h0=True,
                                           g_mode="raw", raw_beta=True, normalize_k=False)
    A_log, dt_bias = kda.make_gate_params(2, 16, seed=22)
    opts = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log,
                dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(23)).to(DEV)
    dht = torch.randn(h0.shape, generator=torch.Generator().manual_seed(24)).to(DEV)
    o, ht, saved = chunk_kda_det_fwd(q, k, v, g, beta, initial_state=h0,
                                     output_final_state=True, **opts)
    low = chunk_kda_det_bwd(do, dht, saved)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0, A_log, dt_bias)]
    o2, ht2 = chunk_kda_det(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                            **{**opts, "A_log": leaves[6], "dt_bias": leaves[7]})
    torch.autograd.backward([o2, ht2], [do, dht])
    assert bitwise_equal(o, o2) and bitwise_equal(ht, ht2)
    for a, leaf in zip(low, leaves, strict=True):
        assert bitwise_equal(a, leaf.grad)
