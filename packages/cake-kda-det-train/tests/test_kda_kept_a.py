"""The forward keeps each chunk's T = (I + A)^-1 and gated ``q k^T`` (Aqk), stacked as the
saved ``A`` ``[2, B * T, HV, 64]``, and the backward launches neither pairs kernel nor the
inverse kernel; a saved set without A (as the custom ops under ``torch.compile`` may give)
makes the backward recompute both: the same bits. The saved A is not written by the
backward. o, final state and every gradient against the float64 reference (packed
documents with an empty and a 1-token one, strong decays). The custom ops under
``torch.compile`` return and load the same stacked A, with the eager entry's bits:
test_kda_compile.py (a caller's plan included)."""

import dataclasses

import pytest
import torch
from cake_core import Mode
from cake_core.testing import bitwise_equal, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetSavedSet,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    make_plan,
)

DEV = default_device()
LENS = [1, 66, 0, 9]
RECOMPUTE = ("kda_fwd_pairs_kernel", "kda_fwd_pairs_tok_kernel", "kda_fwd_inv_kernel")


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **over)


def _case(kda, lens, K=24, V=16, dtype=torch.float32, seed=111):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 2, K, V, dtype, seed=seed,
                                               g_mode="strong", n_states=len(lens), h0=True)
    do = randn(v.shape, dtype, DEV, seed=seed + 1)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 2)
    return (q, k, v, g, beta), h0, kda.cu_of(lens), do, dht


@pytest.mark.parametrize("K, V, dtype, over", [
    (24, 16, torch.float32, dict(block_k_inner=16, block_k_bwd=16)),
    (32, 32, torch.bfloat16, dict(block_k_inner=16, block_k_bwd=16)),
], ids=["fp32", "bf16"])
def test_kept_a_vs_reference(K, V, dtype, over, kda):
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, dtype, seed=113,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    kda.check_vs_reference((q, k, v, g, beta), h0, dtype=dtype, seed=113,
                           cu_seqlens=kda.cu_of(LENS), plan=plan,
                           grad_tol=3e-5 if dtype == torch.float32 else None)


def test_kept_a_same_bits_as_recompute_and_skips_recompute_kernels(kda, monkeypatch):
    """The low-level pair: the backward given the saved T and Aqk launches no pairs or
    inverse kernel (the forward does, once each) and leaves the stack as the forward wrote
    it; a saved set without A recomputes both (one launch each): the same bits (the same
    kernels on the same tables either way: documents of 1, 18, 0 and 9 tokens show it)."""
    inputs, h0, cu, do, dht = _case(kda, [1, 18, 0, 9])
    plan = _plan(24, 16, torch.float32)
    calls = {n: kda.spy_launches(monkeypatch, n) for n in RECOMPUTE}
    o, ht, saved = chunk_kda_det_fwd(*inputs, initial_state=h0, output_final_state=True,
                                     cu_seqlens=cu, plan=plan)
    assert {n: len(c) for n, c in calls.items()} == dict.fromkeys(RECOMPUTE, 1)
    NT = inputs[0].shape[1]
    assert saved.A.shape == (2, NT, 2, 64)
    before = saved.A.clone()
    kept = chunk_kda_det_bwd(do, dht, saved)
    assert {n: len(c) for n, c in calls.items()} == dict.fromkeys(RECOMPUTE, 1)
    assert bitwise_equal(saved.A, before)
    tensors = dict(zip(KDADetSavedSet.tensor_names, saved.tensors(), strict=True))
    no_a = KDADetSavedSet(Mode.DET, {**tensors, "A": None}, meta=saved.meta)
    recomputed = chunk_kda_det_bwd(do, dht, no_a)
    assert {n: len(c) for n, c in calls.items()} == dict.fromkeys(RECOMPUTE, 2)
    for i, (a, b) in enumerate(zip(kept, recomputed, strict=True)):
        assert (a is None) == (b is None), i
        assert a is None or bitwise_equal(a, b), i


