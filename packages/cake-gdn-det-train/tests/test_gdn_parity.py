"""Forward parity with the float64 token-by-token reference on fresh random inputs."""

import pytest
import torch
from cake_core.testing import assert_close_to_reference, bitwise_equal, ragged_cu_seqlens
from cake_core.triton_utils import default_device
from cake_gdn_det_train import chunk_gdn_det_fwd, gdn_reference

DEV = default_device()
F64 = torch.float64


def _check(q, k, v, g, beta, h0, *, dtype, cu=None, scale=None, l2=False, final=True):
    o, ht, saved = chunk_gdn_det_fwd(q, k, v, g, beta, scale=scale, initial_state=h0,
                                     output_final_state=final, use_qk_l2norm_in_kernel=l2,
                                     cu_seqlens=cu)
    o64, ht64 = gdn_reference(q, k, v, g, beta, scale=scale, initial_state=h0,
                              output_final_state=final, use_qk_l2norm_in_kernel=l2,
                              cu_seqlens=cu, dtype=F64)
    assert o.shape == v.shape and o.dtype == q.dtype
    assert_close_to_reference(o, o64, dtype, "o")
    if final:
        assert ht.dtype == torch.float32 and ht.shape == ht64.shape
        # the state is fp32 whatever the input dtype; with 16-bit inputs the default plan
        # feeds it 16-bit intermediates (as FLA), so its error is the inputs' dtype's
        tol = 1e-5 if dtype == torch.float32 else None
        assert_close_to_reference(ht, ht64, dtype, "final_state", tol=tol)
    else:
        assert ht is None
    return o, ht, saved


FIXED = {
    # name: (B, T, H, HV, K, V, dtype, h0)
    "fp32-K32-H=HV-h0": (2, 130, 2, 2, 32, 32, torch.float32, True),
    "fp32-K16-HV=2H": (1, 64, 1, 2, 16, 16, torch.float32, False),
    "bf16-K64-HV=2H-h0": (1, 100, 1, 2, 64, 64, torch.bfloat16, True),
    "fp16-K32-HV=2H": (2, 70, 2, 4, 32, 32, torch.float16, False),
    "fp32-K16-V32": (1, 65, 1, 1, 16, 32, torch.float32, True),
    "bf16-K32-V16-HV=2H": (1, 63, 1, 2, 32, 16, torch.bfloat16, False),
}


@pytest.mark.parametrize("case", list(FIXED))
def test_fixed_length(case, gdn_inputs):
    B, T, H, HV, K, V, dtype, with_h0 = FIXED[case]
    q, k, v, g, beta, h0 = gdn_inputs(B, T, H, HV, K, V, dtype, seed=len(case), h0=with_h0)
    _check(q, k, v, g, beta, h0, dtype=dtype)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an exp overflow in the interpreter
@pytest.mark.parametrize("g_mode", ["real", "strong", "near0"])
def test_decay_regimes(g_mode, gdn_inputs):
    # 100 tokens: a full chunk and a 36-token one, whose past-the-end rows must stay masked
    q, k, v, g, beta, h0 = gdn_inputs(1, 100, 1, 2, 32, 32, seed=7, g_mode=g_mode, h0=True)
    _check(q, k, v, g, beta, h0, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-state", "h0"])
def test_packed_edge_lengths(dtype, with_h0, gdn_inputs):
    lens = [0, 1, 63, 64, 65, 0, 5]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v, g, beta, h0 = gdn_inputs(1, sum(lens), 1, 2, 16, 16, dtype, seed=11,
                                      n_states=len(lens), h0=with_h0)
    o, ht, _ = _check(q, k, v, g, beta, h0, dtype=dtype, cu=cu.to(DEV))
    # empty documents hand back their initial state unchanged (bitwise)
    want = h0 if with_h0 else torch.zeros_like(ht)
    assert bitwise_equal(ht[0], want[0]) and bitwise_equal(ht[5], want[5])


def test_packed_ragged_random_hv2h_int64(gdn_inputs):
    cu = ragged_cu_seqlens(5, 90, generator=torch.Generator().manual_seed(3),
                           dtype=torch.int64)
    T = int(cu[-1])
    q, k, v, g, beta, h0 = gdn_inputs(1, T, 2, 4, 32, 32, seed=13, n_states=5, h0=True)
    _check(q, k, v, g, beta, h0, dtype=torch.float32, cu=cu.to(DEV))


def test_packed_equals_fixed_bitwise(gdn_inputs):
    """Two sequences of 70 tokens: B=2 fixed-length and B=1 packed give the same bits."""
    q, k, v, g, beta, h0 = gdn_inputs(2, 70, 1, 2, 16, 16, seed=17, h0=True)
    o, ht, _ = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    flat = [t.reshape(1, 140, *t.shape[2:]) for t in (q, k, v, g, beta)]
    cu = torch.tensor([0, 70, 140], dtype=torch.int32, device=DEV)
    o2, ht2, _ = chunk_gdn_det_fwd(*flat, initial_state=h0, output_final_state=True,
                                   cu_seqlens=cu)
    assert bitwise_equal(o.reshape(1, 140, 2, 16), o2) and bitwise_equal(ht, ht2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_qk_l2norm_in_kernel(dtype, gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(1, 80, 1, 2, 32, 32, dtype, seed=19, normalize_k=False,
                                      h0=True)
    _, _, saved = _check(q, k, v, g, beta, h0, dtype=dtype, l2=True)
    rstd64 = torch.rsqrt(k.double().pow(2).sum(-1) + 1e-6)
    assert_close_to_reference(saved.k_rstd, rstd64, torch.float32, "k_rstd")


def test_scale_g_beta_in_input_dtype_no_final_state(gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(1, 66, 1, 1, 16, 16, torch.bfloat16, seed=23,
                                      gb_dtype=torch.bfloat16)
    _check(q, k, v, g, beta, h0, dtype=torch.bfloat16, scale=0.3, final=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_head_dim_128(dtype, gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(1, 20, 1, 1, 128, 128, dtype, seed=29, h0=True)
    if DEV.type == "cuda" and dtype == torch.float32:  # fp32 tiles of K=128 overflow smem
        with pytest.raises(ValueError, match=r"fp32 intermediates need K <= 64"):
            chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0)
        return
    _check(q, k, v, g, beta, h0, dtype=dtype)


def test_no_tokens(gdn_inputs):
    q, k, v, g, beta, h0 = gdn_inputs(2, 0, 1, 2, 16, 16, seed=31, h0=True)
    o, ht, _ = chunk_gdn_det_fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.shape == (2, 0, 2, 16) and bitwise_equal(ht, h0)
    q, k, v, g, beta, _ = gdn_inputs(1, 0, 1, 2, 16, 16, seed=31)
    cu = torch.tensor([0, 0, 0], dtype=torch.int32, device=DEV)
    o, ht, _ = chunk_gdn_det_fwd(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    assert o.shape == (1, 0, 2, 16) and bitwise_equal(ht, torch.zeros(2, 2, 16, 16,
                                                                      device=DEV))


def test_saved_set_chunk_quantities(gdn_inputs):
    """g_cumsum is the within-chunk cumsum and A inverts I + strictlower(beta k k^T decay)."""
    q, k, v, g, beta, _ = gdn_inputs(1, 100, 1, 2, 16, 16, seed=37)
    _, _, saved = chunk_gdn_det_fwd(q, k, v, g, beta)
    q, k, g, beta = (t.cpu() for t in (q, k, g, beta))
    A_all, gcum = saved.A.cpu(), saved.g_cumsum.cpu()
    gd = g[0].double()
    want = torch.cat([gd[:64].cumsum(0), gd[64:].cumsum(0)])
    assert_close_to_reference(gcum, want, torch.float32, "g_cumsum")
    for start, end in ((0, 64), (64, 100)):
        n = end - start
        for hv in range(2):
            kk = k[0, start:end, 0].double()
            G = want[start:end, hv]
            b = beta[0, start:end, hv].double()
            raw = (b[:, None] * (kk @ kk.T) * torch.exp(G[:, None] - G[None, :])).tril(-1)
            A = A_all[start:end, hv, :n].double()
            assert_close_to_reference(A @ (torch.eye(n, dtype=F64) + raw),
                                      torch.eye(n, dtype=F64), torch.float32, "A")
            assert torch.all(A_all[start:end, hv, n:] == 0)
