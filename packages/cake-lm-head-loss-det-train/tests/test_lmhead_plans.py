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


@pytest.mark.parametrize("dtype, change, match", [
    # cuBLAS GEMMs need CUDA and 16-bit inputs
    (torch.float32, dict(cublas_gemms=1), "cublas_gemms"),
    # the TMA dweight needs 16-byte rows: V = 300 bf16 is 600 bytes
    (torch.bfloat16, dict(cublas_gemms=0, dw_tma=1), "dw_tma"),
], ids=["cublas_gemms", "dw_tma-unaligned"])
def test_plan_flag_refused_before_any_launch(dtype, change, match):
    H, V = 24, 300
    plan = dataclasses.replace(make_plan(H, V, dtype, DEV), **change)
    h = randn((5, H), dtype, DEV, seed=1)
    w = randn((V, H), dtype, DEV, seed=2)
    before = (h.clone(), w.clone())
    with pytest.raises(ValueError, match=match):
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


@pytest.mark.parametrize("route", ["deferred", "chunked", "chunked+main_grad"])
def test_dw_tma_matches_float64_and_pointer_loads(route):
    """The TMA dweight (the Hopper rule's ``dw_tma = 1``) on both gradient routes, from a
    hidden at an unaligned start (copied for TMA, the caller's tensor untouched)."""
    T = 100 if route == "deferred" else 301  # deferred: T <= defer_dw_tokens = 2 H
    H, V = 64, 1000
    base = make_plan(H, V, torch.bfloat16, DEV)
    plan = dataclasses.replace(base, cublas_gemms=0, chunk_tokens=128, dw_tma=1)
    flat = randn((T * H + 1,), torch.bfloat16, DEV, seed=1)
    h = flat[1:].view(T, H).detach().requires_grad_()  # 2 bytes past an aligned start
    h_before = h.detach().clone()
    w = randn((V, H), torch.bfloat16, DEV, seed=2, scale=0.3).requires_grad_()
    y = (torch.arange(T) * 37 % V).to(DEV)
    y[::5] = -100
    mg = randn((V, H), torch.float32, DEV, seed=5) if "main_grad" in route else None
    start = mg.clone() if mg is not None else None
    grads = []
    for p in (plan, dataclasses.replace(plan, dw_tma=0)):
        h.grad = w.grad = None
        if mg is not None:
            mg.copy_(start)
        loss = lm_head_loss_det(h, w, y, plan=p, main_grad=mg)
        loss.backward()
        grads.append(((mg - start) if mg is not None else w.grad).clone())
    assert torch.equal(h.detach(), h_before)
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    ref = lm_head_loss_reference(h64, w64, y, dtype=torch.float64)
    ref.backward()
    assert_close_to_reference(grads[0], w64.grad, torch.bfloat16, "dweight (tma)")
    # TMA and pointer loads: the same tiles and order, so the same values up to the dot's
    # inner order (bits not promised equal across the two)
    assert_close_to_reference(grads[0], grads[1].double(), torch.bfloat16, "tma vs pointer")


def test_dw_tma_rule(monkeypatch):
    import cake_lm_head_loss_det_train.plan as plan_mod

    for cap, dtype, V, want in (((9, 0), torch.bfloat16, 128256, 1),
                                ((9, 0), torch.float16, 32000, 1),
                                ((8, 0), torch.bfloat16, 128256, 0),
                                ((12, 0), torch.bfloat16, 128256, 0),
                                ((9, 0), torch.float32, 128256, 0),
                                ((9, 0), torch.bfloat16, 128257, 0)):
        monkeypatch.setattr(plan_mod, "cuda_capability", lambda device, cap=cap: cap)
        assert make_plan(4096, V, dtype, "cuda").dw_tma == want, (cap, dtype, V)
    assert make_plan(4096, 128256, torch.bfloat16, "cpu").dw_tma == 0
    old = make_plan(4096, 128256, torch.bfloat16, "cpu").to_dict()
    del old["dw_tma"]  # a dict from before the field: pointer loads
    assert type(make_plan(64, 64, torch.bfloat16, "cpu")).from_dict(old).dw_tma == 0


@pytest.mark.parametrize("grad_in_forward", [1, 0])
def test_dw_tma_tile_over_tma_box_refused_before_any_launch(grad_in_forward):
    """A TMA box edge is at most 256 elements: a dw_tma=1 plan with a larger dweight tile
    is refused by the entry (and ``is_supported``) before any launch, not by the dweight
    GEMM after the forward ran."""
    from cake_core.testing import no_kernel_launches
    from cake_lm_head_loss_det_train import api, is_supported

    H, V, T = 64, 200, 40
    plan = dataclasses.replace(make_plan(H, V, torch.bfloat16, DEV), cublas_gemms=0,
                               dw_tma=1, dw_block_n=512, grad_in_forward=grad_in_forward)
    h = randn((T, H), torch.bfloat16, DEV, seed=1).requires_grad_()
    w = randn((V, H), torch.bfloat16, DEV, seed=2, scale=0.3).requires_grad_()
    y = (torch.arange(T) * 37 % V).to(DEV)
    before = (h.detach().clone(), w.detach().clone())
    with no_kernel_launches(api, "_forward_impl", "_backward_impl", "_run_chunks"):
        s = is_supported(h, w, y, plan=plan)
        assert not s and "dw_tma" in s.reason and "256" in s.reason
        with pytest.raises(ValueError, match="dw_tma"):
            lm_head_loss_det(h, w, y, plan=plan)
    assert torch.equal(h.detach(), before[0]) and torch.equal(w.detach(), before[1])
    # 256 is served
    lm_head_loss_det(h, w, y, plan=dataclasses.replace(plan, dw_block_n=256)).backward()


def test_dw_tma_deferred_route_reads_unaligned_saved_dlogits():
    """Saved-tensor hooks (offloading into one flat buffer) may hand the backward views at
    an unaligned start: the deferred route's kept dlogits are copied for TMA like the
    hidden, as dw_tma=0 serves them."""
    T, H, V = 50, 64, 200  # T <= defer_dw_tokens = 2 H: the deferred route
    base = dataclasses.replace(make_plan(H, V, torch.bfloat16, DEV), cublas_gemms=0)
    assert base.grad_in_forward and T <= base.defer_dw_tokens

    def pack(t):
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        buf[1:].copy_(t.reshape(-1))
        return buf, t.shape

    def unpack(packed):
        buf, shape = packed
        return buf[1:].view(shape)  # one element past an aligned start

    grads = []
    for tma in (1, 0):
        h = randn((T, H), torch.bfloat16, DEV, seed=1).requires_grad_()
        w = randn((V, H), torch.bfloat16, DEV, seed=2, scale=0.3).requires_grad_()
        y = (torch.arange(T) * 37 % V).to(DEV)
        y[::5] = -100
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = lm_head_loss_det(h, w, y, plan=dataclasses.replace(base, dw_tma=tma))
        loss.backward()
        grads.append(w.grad)
    h64, w64 = (t.detach().double().requires_grad_() for t in (h, w))
    lm_head_loss_reference(h64, w64, y, dtype=torch.float64).backward()
    assert_close_to_reference(grads[0], w64.grad, torch.bfloat16, "dweight (tma)")
    assert_close_to_reference(grads[0], grads[1].double(), torch.bfloat16, "tma vs pointer")
