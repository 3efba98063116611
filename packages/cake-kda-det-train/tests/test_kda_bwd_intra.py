"""The backward's terms between tokens of the 16-token sub-chunks: the sub-chunk kernel
(``kda_bwd_intra_kernel``, the earlier and later sub-chunks by dots) then the
token-parallel kernel (``kda_bwd_intra_tok_kernel``, the terms inside each sub-chunk). o,
final state and every gradient against the float64 reference (packed documents with an
empty and a 1-token one, value heads in a partly filled block of 4, strong decays, K off
the block size); with one value head per q/k head the token-parallel kernel stores dq and
dk in the gradients' dtype (the same bits as a cast afterwards)."""

import dataclasses

import pytest
import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import make_plan

DEV = default_device()
LENS = [1, 37, 0, 5]


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **over)


# the same plans at H = 1, HV = 2 (fp32 K = 24 / V = 16 and bf16 K = V = 32, block_k_inner =
# block_k_bwd = 16) are checked against float64 by test_kda_kept_a.py::test_kept_a_vs_reference, on
# documents of 1, 66, 0 and 9 tokens (chunks and sub-chunks cut short, an empty and a
# 1-token document, one across a chunk boundary)
@pytest.mark.parametrize("K, V, H, HV, dtype, over", [
    (24, 16, 3, 6, torch.float32, dict(block_k_inner=16, block_k_bwd=16)),
], ids=["fp32-hv6"])
def test_bwd_intra_vs_reference(K, V, H, HV, dtype, over, kda):
    """Documents of 1, 37, 0 and 5 tokens (chunks and sub-chunks cut short, an empty
    document, a 1-token one; the 37-token one has a sub-chunk with sub-chunks before and
    after it); K = 24 ends inside a 32-wide channel tile; HV = 6 fills one block of 4 value
    heads and half of the next."""
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=91, H=H, HV=HV)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("l2", [False, True], ids=["plain", "l2norm"])
def test_one_value_head_per_qk_head_stores_dq_dk_in_place_of_the_cast(dtype, l2, kda,
                                                                      monkeypatch):
    """H = HV: the token-parallel kernel, the last to add to dq and dk, stores them in the
    gradients' dtype itself (no value-head sum, no cast pass; fp32 under the interpreter for
    bf16, cast by torch; fp32 before the L2 norm's backward). The same bits as the fp32
    buffers cast afterwards (the skipped pass checked; compared where the stored dtype is
    not fp32 already, else both calls would run the same code: fp32, and bf16 under the
    interpreter) and float64 parity of the same call, on documents of 1, 20, 0 and 5 tokens
    (the store is per token: any documents with an empty, a 1-token one and a sub-chunk cut
    short)."""
    from cake_kda_det_train import chunk as chunk_mod
    from cake_kda_det_train import chunk_kda_det

    K, V = 24, 16
    plan = kda.variant_plan(_plan, K, V, dtype, dict(block_k_inner=16, block_k_bwd=16))
    lens = [1, 20, 0, 5]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 2, 2, K, V, dtype, seed=101,
                                               g_mode="strong", n_states=len(lens), h0=True,
                                               normalize_k=not l2)
    cu = kda.cu_of(lens)
    do = randn(v.shape, dtype, DEV, seed=102)
    dht = randn(h0.shape, torch.float32, DEV, seed=103)
    kw = dict(cu_seqlens=cu, plan=plan, use_qk_l2norm_in_kernel=l2)
    sums = []
    real_sum = chunk_mod.group_sum_cast
    monkeypatch.setattr(chunk_mod, "group_sum_cast",
                        lambda *a, **k: sums.append(1) or real_sum(*a, **k))
    o, ht, got = kda.run_autograd(chunk_kda_det, (q, k, v, g, beta), (h0, None, None), do,
                                  dht, **kw)
    assert not sums  # the token-parallel kernel ran and stored dq, dk
    assert got[0].dtype == got[1].dtype == dtype
    if chunk_mod.direct_store_dtype(dtype) != torch.float32:  # dv's store; dq / dk's unless l2
        monkeypatch.setattr(chunk_mod, "direct_store_dtype", lambda dt: torch.float32)
        o2, ht2, cast_after = kda.run_autograd(chunk_kda_det, (q, k, v, g, beta),
                                               (h0, None, None), do, dht, **kw)
        assert torch.equal(o, o2) and torch.equal(ht, ht2)
        for i, (a, b) in enumerate(zip(got, cast_after, strict=True)):
            assert (a is None) == (b is None), i
            assert a is None or (a.dtype == b.dtype and torch.equal(a, b)), f"gradient {i}"
    kda.assert_matches_reference((q, k, v, g, beta), (h0, None, None), do, dht,
                                 (o, ht, got), dtype=dtype, **kw)


@pytest.mark.parametrize("H, HV", [(2, 2), (1, 2)], ids=["fused", "gva-separate"])
def test_l2norm_backward_in_the_token_kernel(H, HV, kda, monkeypatch):
    """With the q/k L2 norm and one value head per q/k head the token-parallel kernel runs
    the norm's backward on the whole rows it holds (no separate L2-norm backward launch);
    with more value heads the fp32 value-head sums go through cake-core's kernel. The
    backward reads the normalised q and k the forward kept (no norm in the backward). Both
    against float64 on documents of 1, 20, 0 and 5 tokens, bf16."""
    import cake_kda_det_train.api as api
    import cake_kda_det_train.chunk as chunk

    norms, fwds = [], []
    real_norm, real_fwd = api._l2norm, api._launch_fwd
    monkeypatch.setattr(api, "_l2norm", lambda *a, **k: norms.append(1) or real_norm(*a, **k))
    monkeypatch.setattr(api, "_launch_fwd", lambda *a, **k: fwds.append(1) or real_fwd(*a, **k))
    seen = []
    real = chunk.l2norm_bwd
    monkeypatch.setattr(chunk, "l2norm_bwd", lambda *a, **k: seen.append(1) or real(*a, **k))
    launches = kda.spy_launches(monkeypatch, "kda_bwd_intra_tok_kernel")
    K, V, lens = 24, 16, [1, 20, 0, 5]
    plan = kda.variant_plan(_plan, K, V, torch.bfloat16,
                            dict(block_k_inner=16, block_k_bwd=16))
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), H, HV, K, V, torch.bfloat16,
                                               seed=131, n_states=len(lens), h0=True,
                                               normalize_k=False)
    kda.check_vs_reference((q, k, v, g, beta), h0, dtype=torch.bfloat16, seed=132,
                           plan=plan, cu_seqlens=kda.cu_of(lens),
                           use_qk_l2norm_in_kernel=True)
    assert {kw["L2"] for _, kw in launches} == {H == HV}
    assert len(seen) == (0 if H == HV else 2)
    assert fwds and len(norms) == 2 * len(fwds)  # q and k, in the forwards only
