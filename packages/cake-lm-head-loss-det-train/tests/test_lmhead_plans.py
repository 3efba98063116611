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


@pytest.mark.parametrize("route", ["deferred", "chunked", "fp32-none", "main-grad"])
def test_dw_tma_matches_float64_and_repeats(route):
    """``dw_tma=1``: the dweight GEMM through cake-core's TMA kernel, on each route that
    computes dweight (the deferred one-GEMM route with the upstream gradient as a device
    scale, the chunk-by-chunk fp32 sum, the backward-time chunks of ``reduction="none"``,
    an fp32 ``main_grad``): float64 parity and bitwise repeats."""
    H, V = 64, 1000
    dtype = torch.float32 if route == "fp32-none" else torch.bfloat16
    reduction = "none" if route == "fp32-none" else "mean"
    T = 100 if route in ("deferred", "main-grad") else 301  # deferred: T <= 2 H
    base = make_plan(H, V, dtype, DEV, reduction=reduction)
    plan = dataclasses.replace(base, dw_tma=1, chunk_tokens=64,
                               defer_dw_tokens=0 if route == "chunked" else base.defer_dw_tokens)
    y = (torch.arange(T) * 37 % V).to(DEV)
    y[::5] = -100
    h0 = randn((T, H), dtype, DEV, seed=1)
    w0 = randn((V, H), dtype, DEV, seed=2, scale=0.3)
    up = randn((T,) if reduction == "none" else (), torch.float32, DEV, seed=4)

    def run():
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        if route == "main-grad":
            mg = randn((V, H), torch.float32, DEV, seed=5)
            start = mg.clone()
            loss = lm_head_loss_det(h, w, y, plan=plan, main_grad=mg)
            loss.backward(up)
            return loss, h.grad, mg - start
        loss = lm_head_loss_det(h, w, y, plan=plan, reduction=reduction)
        loss.backward(up)
        return loss, h.grad, w.grad

    first = run()
    h64, w64 = (t.double().requires_grad_() for t in (h0, w0))
    ref = lm_head_loss_reference(h64, w64, y, dtype=torch.float64, reduction=reduction)
    ref.backward(up.double())
    tol_dtype = torch.float32 if route == "main-grad" else dtype
    assert_close_to_reference(first[0], ref, dtype, "loss")
    assert_close_to_reference(first[1], h64.grad, dtype, "dhidden")
    assert_close_to_reference(first[2], w64.grad, tol_dtype if dtype == torch.float32 else
                              torch.bfloat16, "dweight")
    again = run()
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_dw_tma_refusals():
    h = randn((8, 20), torch.bfloat16, DEV, seed=1)  # H = 20: not a multiple of 8
    w = randn((64, 20), torch.bfloat16, DEV, seed=2)
    y = torch.zeros(8, dtype=torch.long, device=DEV)
    plan = dataclasses.replace(make_plan(20, 64, torch.bfloat16, DEV), dw_tma=1)
    with pytest.raises(ValueError, match="multiples of 8"):
        lm_head_loss_det(h, w, y, plan=plan)
    base = randn((8 * 64 + 1,), torch.bfloat16, DEV, seed=3)
    hu = base[1:].view(8, 64)  # a 2-byte offset: not 16-byte aligned
    w2 = randn((64, 64), torch.bfloat16, DEV, seed=4)
    plan2 = dataclasses.replace(make_plan(64, 64, torch.bfloat16, DEV), dw_tma=1)
    before = hu.clone()
    with pytest.raises(ValueError, match="16-byte aligned"):
        lm_head_loss_det(hu, w2, y, plan=plan2)
    assert torch.equal(hu, before)
