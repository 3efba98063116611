"""A bf16 / fp16 ``initial_state`` in the autograd entry, taken as FLA takes it (FLA loads
the state as fp32): the entry runs with an fp32 copy, so o, final_state and every gradient
have the bits of the same call with ``initial_state.float()``, and dinitial_state is that
call's fp32 gradient cast to the state's dtype (autograd's rule: a leaf's gradient has the
leaf's dtype). Checked against float64 autograd through the reference too, on packed ragged
documents (an empty and a one-token one, one across a 16-token sub-chunk boundary; the
state is upcast once at the entry, so the documents' lengths do not matter: chunk
boundaries are checked with an fp32 state in test_kda_parity.py); the caller's tensor
is left as it was; torch.compile traces the upcast with the op. The low-level entries keep
taking fp32 only (test_kda_bad_inputs.py)."""

import pytest
import torch
from cake_core.testing import (
    assert_close_to_reference,
    assert_compiles_to_op,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device
from cake_kda_det_train import chunk_kda_det

DEV = default_device()
F64 = torch.float64
LENS = [5, 0, 1, 20]
HV, K, V = 2, 16, 16
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dinitial_state", "dA_log", "ddt_bias")


def _case(kda, raw: bool, seed: int):
    """fp32 leaves on packed ``LENS`` documents with an initial state per document; with
    ``raw`` every in-kernel option (L2 norm, gate from the raw g, beta sigmoid)."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, HV, K, V, seed=seed,
                                               n_states=len(LENS), h0=True, g_mode="raw" if
                                               raw else "real", raw_beta=raw,
                                               normalize_k=not raw)
    A_log, dt_bias = kda.make_gate_params(HV, K, seed=seed + 10) if raw else (None, None)
    opts = dict(cu_seqlens=kda.cu_of(LENS))
    if raw:
        opts.update(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                    use_beta_sigmoid_in_kernel=True)
    return (q, k, v, g, beta), h0, A_log, dt_bias, opts


# each state dtype once and each option set once: the upcast at the entry is the same for
# both dtypes and comes before any option is read
@pytest.mark.parametrize("dtype, raw", [(torch.bfloat16, True), (torch.float16, False)],
                         ids=["bf16-every-option", "fp16-plain"])
def test_16bit_state_has_the_bits_of_its_fp32_copy(dtype, raw, kda):
    seed = 31 if raw else 37
    inputs, h0, A_log, dt_bias, opts = _case(kda, raw, seed)
    h16 = h0.to(dtype)
    do = randn(inputs[2].shape, torch.float32, DEV, seed=seed + 100)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 101)
    o, ht, got = kda.run_autograd(chunk_kda_det, inputs, (h16, A_log, dt_bias), do, dht,
                                  **opts)
    o32, ht32, want = kda.run_autograd(chunk_kda_det, inputs, (h16.float(), A_log, dt_bias),
                                       do, dht, **opts)
    assert ht.dtype == torch.float32
    assert bitwise_equal(o, o32) and bitwise_equal(ht, ht32)
    for name, a, b in zip(GRADS, got, want, strict=True):
        if name == "dinitial_state":
            assert a.dtype == dtype and a.shape == h16.shape
            assert bitwise_equal(a, b.to(dtype)), name
        else:
            assert bitwise_equal(a, b), name
    # against float64 autograd through the reference (the state's values: h16's)
    d64 = [t.double() if t is not None else None for t in (h16, A_log, dt_bias)]
    o_r, ht_r, ref = kda.run_autograd(kda.reference64, [t.double() for t in inputs], d64,
                                      do.double(), dht.double(), **opts)
    assert_close_to_reference(o, o_r, torch.float32, "o")
    assert_close_to_reference(ht, ht_r, torch.float32, "final_state")
    for name, a, b in zip(GRADS, got, ref, strict=True):
        if b is None:
            assert a is None, name
            continue
        # dinitial_state is rounded to the state's dtype; the sums over every token of
        # dA_log / ddt_bias at the fp32 parameter tolerance (conftest.PARAM_TOL_FP32)
        tol = kda.PARAM_TOL_FP32 if name in ("dA_log", "ddt_bias") else None
        assert_close_to_reference(a, b, dtype if name == "dinitial_state" else torch.float32,
                                  name, tol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_inputs_and_state_vs_float64(dtype, kda):
    """q, k, v and the state in the same 16-bit dtype (the usual mixed-precision call),
    every gradient against float64 within that dtype's tolerance."""
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, HV, 32, 32, dtype, seed=41,
                                               n_states=len(LENS), h0=True, gb_dtype=dtype)
    kda.check_vs_reference((q, k, v, g, beta), h0.to(dtype), dtype=dtype, seed=41,
                           cu_seqlens=kda.cu_of(LENS))


def test_caller_state_unchanged_and_no_grad_state(kda):
    """The caller's 16-bit tensor keeps its values and dtype (with and without autograd on
    it); a state that needs no gradient gets none, the other leaves theirs."""
    inputs, h0, _, _, opts = _case(kda, False, 43)
    hb = h0.bfloat16()
    before = hb.clone()
    leaves = [t.clone().requires_grad_() for t in inputs]
    o, ht = chunk_kda_det(*leaves, initial_state=hb, output_final_state=True, **opts)
    (o.sum() + ht.sum()).backward()
    assert hb.grad is None and all(t.grad is not None for t in leaves)
    hg = hb.clone().requires_grad_()
    o2, ht2 = chunk_kda_det(*inputs, initial_state=hg, output_final_state=True, **opts)
    (o2.sum() + ht2.sum()).backward()
    assert bitwise_equal(o, o2) and bitwise_equal(ht, ht2)
    assert hg.grad.dtype == torch.bfloat16 and torch.isfinite(hg.grad.float()).all()
    assert hb.dtype == torch.bfloat16 and bitwise_equal(hb, before)
    assert bitwise_equal(hg.detach(), before)


def test_compile_fullgraph_16bit_state(kda):
    """Traced in one frame (the upcast then the custom op), eager's bits."""
    inputs, h0, _, _, opts = _case(kda, False, 47)
    cu = opts["cu_seqlens"]

    def step(q, k, v, g, beta, h, cu):
        o, ht = chunk_kda_det(q, k, v, g, beta, initial_state=h, output_final_state=True,
                              cu_seqlens=cu)
        return (o * o).sum() + 0.1 * (ht * ht.detach().sin()).sum(), o, ht

    backend = "aot_eager" if DEV.type == "cpu" else "inductor"
    assert_compiles_to_op(step, (*inputs, h0.bfloat16()), (cu,),
                          ("o", "final_state", *GRADS[:6]), backend=backend,
                          op="cake_kda_det_train.fwd")
