"""cake-kda-nondet-train's o, final_state and every gradient against float64 autograd
through cake-kda-det-train's token-by-token reference: packed ragged documents (an empty
and a one-token one), the gate-in-kernel call Kimi Linear makes, a bf16 / fp16 initial
state, the low-level entries and torch.compile."""

import pytest
import torch
from _kda_nd_cases import DEV, NAMES, PARAM_TOL_FP32, check, cu_of, make, reference, run
from cake_core.testing import assert_close_to_reference, randn
from cake_kda_nondet_train import (
    KDANondetGrads,
    KDANondetSavedSet,
    chunk_kda_nondet,
    chunk_kda_nondet_bwd,
    chunk_kda_nondet_fwd,
)


def test_packed_ragged_empty_and_one_token_documents():
    """Documents of 5, 0, 1 and 70 tokens (one across a 64-token chunk boundary), an initial
    state per document, GVA (HV = 2H)."""
    lens = [5, 0, 1, 70]
    leaves = make(1, sum(lens), 1, 2, 16, 16, seed=3, n_states=len(lens))
    check(chunk_kda_nondet, leaves, seed=3, n_states=len(lens), cu_seqlens=cu_of(lens))


def test_gate_in_kernel_kimi_linear_call():
    """Kimi Linear's call (FLA's KimiDeltaAttention): the in-kernel q/k L2 norm, the gate
    -exp(A_log) softplus(g + dt_bias) from the raw g, the beta sigmoid; fixed length,
    B = 2, two q/k heads, K = 32 != V = 16."""
    leaves = make(2, 40, 2, 4, 32, 16, seed=11, raw=True)
    got = check(chunk_kda_nondet, leaves, seed=11, n_states=2, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    assert got[8] is not None and got[9] is not None  # dA_log, ddt_bias


def test_gate_lower_bound_packed_neg_eigval():
    """lower_bound * sigmoid(exp(A_log) (g + dt_bias)), packed, beta' = 2 sigmoid(beta)."""
    lens = [1, 0, 30]
    leaves = make(1, sum(lens), 1, 2, 16, 16, seed=13, raw=True, n_states=len(lens))
    check(chunk_kda_nondet, leaves, seed=13, n_states=len(lens), cu_seqlens=cu_of(lens),
          use_gate_in_kernel=True, lower_bound=-3.0, use_beta_sigmoid_in_kernel=True,
          allow_neg_eigval=True)


def test_low_level_entries_match_autograd():
    """chunk_kda_nondet_fwd / _bwd give what the autograd entry gives (every option on),
    in this package's types."""
    lens = [0, 1, 33]
    q, k, v, g, beta, h0, A_log, dt_bias = make(1, sum(lens), 1, 2, 16, 16, seed=21,
                                                raw=True, n_states=3)
    opts = dict(cu_seqlens=cu_of(lens), use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    do = randn(v.shape, torch.float32, DEV, seed=23)
    dht = randn(h0.shape, torch.float32, DEV, seed=24)
    o, ht, saved = chunk_kda_nondet_fwd(q, k, v, g, beta, initial_state=h0,
                                        output_final_state=True, **opts)
    assert isinstance(saved, KDANondetSavedSet)
    low = chunk_kda_nondet_bwd(do, dht, saved)
    assert isinstance(low, KDANondetGrads)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0, A_log, dt_bias)]
    o2, ht2 = chunk_kda_nondet(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                               **{**opts, "A_log": leaves[6], "dt_bias": leaves[7]})
    torch.autograd.backward([o2, ht2], [do, dht])
    torch.testing.assert_close(o2, o)
    torch.testing.assert_close(ht2, ht)
    for a, leaf in zip(low, leaves, strict=True):
        torch.testing.assert_close(leaf.grad, a)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_initial_state_runs_as_its_fp32_copy(dtype):
    """A bf16 / fp16 initial_state is taken as FLA takes it (upcast to an fp32 copy):
    what ``initial_state.float()`` gives (within fp32 rounding: the bits are not promised),
    dinitial_state in the state's dtype, everything against the float64 reference (the
    state's gradient within its dtype's rounding); the caller's tensor unchanged."""
    lens = [5, 0, 1, 70]
    q, k, v, g, beta, h0, A_log, dt_bias = make(1, sum(lens), 1, 2, 16, 16, seed=51,
                                                raw=True, n_states=len(lens))
    h16 = h0.to(dtype)
    before = h16.clone()
    kw = dict(cu_seqlens=cu_of(lens), use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True)
    do = randn(v.shape, torch.float32, DEV, seed=151)
    dht = randn(h0.shape, torch.float32, DEV, seed=152)
    got = run(chunk_kda_nondet, (q, k, v, g, beta, h16, A_log, dt_bias), do, dht, **kw)
    f32 = run(chunk_kda_nondet, (q, k, v, g, beta, h16.float(), A_log, dt_bias), do, dht,
              **kw)
    ref = reference((q, k, v, g, beta, h16, A_log, dt_bias), do, dht, **kw)
    assert torch.equal(h16, before) and h16.dtype == dtype
    for name, a, b, r in zip(NAMES, got, f32, ref, strict=True):
        if name == "dinitial_state":
            assert a.dtype == dtype and a.shape == h16.shape
            torch.testing.assert_close(a, b.to(dtype))
            assert_close_to_reference(a, r, dtype, name)
            continue
        torch.testing.assert_close(a, b)
        tol = {"final_state": 1e-5, "dA_log": PARAM_TOL_FP32,
               "ddt_bias": PARAM_TOL_FP32}.get(name)
        assert_close_to_reference(a, r, torch.float32, name, tol=tol)


def test_compile_fullgraph_runs_the_nondet_ops():
    """torch.compile(fullgraph=True) traces one frame that calls
    ``cake_kda_nondet_train::fwd`` and gives the eager entry's outputs and gradients
    (within fp32 rounding: the bits are not promised)."""
    from cake_core.testing import leaf_grads
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    lens = (0, 11, 30)
    leaves = make(1, sum(lens), 1, 2, 16, 16, seed=31, raw=True, n_states=3)

    def step(q, k, v, g, beta, h0, A_log, dt_bias, cu):
        o, ht = chunk_kda_nondet(q, k, v, g, beta, None, h0, True, cu_seqlens=cu,
                                 use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                 A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
        return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    cu = cu_of(lens)
    want = leaf_grads(step, leaves, cu)
    cnt = CompileCounterWithBackend("aot_eager" if DEV.type == "cpu" else "inductor")
    got = leaf_grads(torch.compile(step, fullgraph=True, backend=cnt), leaves, cu)
    assert cnt.frame_count == 1 and "cake_kda_nondet_train.fwd" in cnt.graphs[0].code
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
