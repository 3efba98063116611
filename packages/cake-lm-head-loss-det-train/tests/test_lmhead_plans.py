"""Non-default plans against the float64 reference: many vocabulary blocks (the online
logsumexp across blocks), odd chunk sizes, small GEMM tiles, a split dhidden GEMM."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, randn
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import lm_head_loss_det, lm_head_loss_reference, make_plan

DEV = default_device()
TILES = {f"{g}_block_{d}": 16 for g in ("logits", "dh", "dw") for d in "mnk"}

VARIANTS = {
    "default": {},
    "many-vocab-blocks": dict(block_v=16, block_m=4, chunk_tokens=5),
    "one-row-small-tiles": dict(block_v=64, block_m=1, chunk_tokens=7, **TILES),
    "split-dh": dict(block_v=128, chunk_tokens=13, dh_split=4, loss_block=8),
}


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plan_variant_matches_float64(variant, reduction):
    T, H, V = 29, 24, 300
    base = make_plan(H, V, torch.float32, DEV, reduction=reduction)
    plan = dataclasses.replace(base, **VARIANTS[variant])
    h = randn((T, H), torch.float32, DEV, seed=1).requires_grad_()
    w = randn((V, H), torch.float32, DEV, seed=2, scale=0.4).requires_grad_()
    b = randn((V,), torch.float32, DEV, seed=3).requires_grad_()
    y = (torch.arange(T) * 37 % V).to(DEV)
    y[::6] = -100
    opts = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3, logit_softcap=4.0)
    loss, lse = lm_head_loss_det(h, w, y, bias=b, plan=plan, return_lse=True, **opts)
    up = randn(loss.shape, torch.float32, DEV, seed=4)
    loss.backward(up)
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    ref, lse64 = lm_head_loss_reference(h64, w64, y, b64, return_lse=True,
                                        dtype=torch.float64, **opts)
    ref.backward(up.double())
    for name, a, r in (("loss", loss, ref), ("lse", lse, lse64), ("dhidden", h.grad, h64.grad),
                       ("dweight", w.grad, w64.grad), ("dbias", b.grad, b64.grad)):
        assert_close_to_reference(a, r, torch.float32, name)


def test_cublas_flag_needs_cuda_and_16_bit():
    H, V = 24, 300
    plan = dataclasses.replace(make_plan(H, V, torch.float32, DEV), cublas_gemms=1)
    h = randn((5, H), torch.float32, DEV, seed=1)
    w = randn((V, H), torch.float32, DEV, seed=2)
    before = (h.clone(), w.clone())
    with pytest.raises(ValueError, match="cublas_gemms"):
        lm_head_loss_det(h, w, torch.zeros(5, dtype=torch.long, device=DEV), plan=plan)
    assert torch.equal(h, before[0]) and torch.equal(w, before[1])


@pytest.mark.parametrize("cublas", [0, 1], ids=["cake-gemms", "cublas-gemms"])
def test_bf16_gemm_routes_match_float64(cublas):
    """Both GEMM routes of a 16-bit plan (cuBLAS is the CUDA default) against float64,
    with a bias, ragged chunks and ignored rows."""
    if cublas and DEV.type != "cuda":
        pytest.skip("the cuBLAS route exists on CUDA only")
    T, H, V = 301, 64, 1000
    plan = dataclasses.replace(make_plan(H, V, torch.bfloat16, DEV), cublas_gemms=cublas,
                               chunk_tokens=128)
    h = randn((T, H), torch.bfloat16, DEV, seed=1).requires_grad_()
    w = randn((V, H), torch.bfloat16, DEV, seed=2, scale=0.3).requires_grad_()
    b = randn((V,), torch.bfloat16, DEV, seed=3).requires_grad_()
    y = (torch.arange(T) * 37 % V).to(DEV)
    y[::5] = -100
    loss = lm_head_loss_det(h, w, y, bias=b, plan=plan, z_loss=1e-3)
    loss.backward()
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (h, w, b))
    ref = lm_head_loss_reference(h64, w64, y, b64, dtype=torch.float64, z_loss=1e-3)
    ref.backward()
    for name, a, r in (("loss", loss, ref), ("dhidden", h.grad, h64.grad),
                       ("dweight", w.grad, w64.grad), ("dbias", b.grad, b64.grad)):
        assert_close_to_reference(a, r, torch.bfloat16, name)
