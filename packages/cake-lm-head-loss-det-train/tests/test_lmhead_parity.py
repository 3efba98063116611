"""Parity with the float64 reference: loss, lse and every gradient, all options."""

import dataclasses

import pytest
import torch
from cake_core.testing import TOLERANCES, assert_close_to_reference, randn, rel_fro_error
from cake_core.triton_utils import default_device
from cake_lm_head_loss_det_train import lm_head_loss_det, lm_head_loss_reference, make_plan

DEV = default_device()

OPTIONS = {
    "plain": {},
    "smoothing": {"label_smoothing": 0.1},
    "zloss": {"z_loss": 1e-2},
    "softcap": {"logit_softcap": 2.5},
    "all": {"label_smoothing": 0.2, "z_loss": 1e-3, "logit_softcap": 3.0},
}


def _inputs(shape, H, V, dtype, *, bias=False, ignore_every=4, seed=0):
    hidden = randn((*shape, H), dtype, DEV, seed=seed + 1).requires_grad_()
    weight = randn((V, H), dtype, DEV, seed=seed + 2, scale=H ** -0.5 * 2).requires_grad_()
    b = randn((V,), dtype, DEV, seed=seed + 3, scale=0.5).requires_grad_() if bias else None
    g = torch.Generator().manual_seed(seed + 4)
    labels = torch.randint(0, V, shape, generator=g)
    if ignore_every:
        labels.view(-1)[::ignore_every] = -100
    return hidden, weight, b, labels.to(DEV)


def _close(actual, ref, dtype, name, tol, floor):
    """Relative error, against at least ``floor``: with V = 1 the true loss and gradients are
    0 and the kernels' O(eps) round-off must be judged on the scale of the logits."""
    if floor is None:
        return assert_close_to_reference(actual, ref, dtype, name, tol)
    assert torch.isfinite(actual.detach().float()).all()
    norm = float(ref.detach().norm())
    err = rel_fro_error(actual, ref) * max(norm, 1e-30) / max(norm, floor)
    assert err <= tol, f"{name}: error {err:.3e} > {tol:.1e}"


def _check(hidden, weight, b, labels, dtype, plan=None, tol=None, **opts):
    loss, lse = lm_head_loss_det(hidden, weight, labels, bias=b, return_lse=True, plan=plan,
                                 **opts)
    red = opts.get("reduction", "mean")
    up = randn(loss.shape, torch.float32, DEV, seed=77) if red == "none" else \
        torch.tensor(0.7, device=DEV)
    loss.backward(up)
    h64, w64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    b64 = b.detach().double().requires_grad_() if b is not None else None
    ref, lse64 = lm_head_loss_reference(h64, w64, labels, b64, return_lse=True,
                                        dtype=torch.float64, **opts)
    ref.backward(up.double())
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    assert lse.dtype == torch.float32 and lse.shape == labels.shape
    tol = tol or TOLERANCES[dtype]
    floor = 1.0 if weight.shape[0] == 1 else None
    _close(loss, ref, dtype, "loss", tol, floor)
    _close(lse, lse64, dtype, "lse", tol, floor)
    assert hidden.grad.dtype == dtype and weight.grad.dtype == dtype
    _close(hidden.grad, h64.grad, dtype, "dhidden", tol, floor)
    _close(weight.grad, w64.grad, dtype, "dweight", tol, floor)
    if b is not None:
        _close(b.grad, b64.grad, dtype, "dbias", tol, floor)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("V", [1, 7, 1000])
def test_parity_fp32(V, option, reduction):
    hidden, weight, b, labels = _inputs((37,), 24, V, torch.float32, bias=V == 7,
                                        seed=V)
    _check(hidden, weight, b, labels, torch.float32, reduction=reduction, **OPTIONS[option])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_parity_vocab_32000(reduction):
    hidden, weight, b, labels = _inputs((6,), 16, 32000, torch.float32, bias=True, seed=5)
    _check(hidden, weight, b, labels, torch.float32, reduction=reduction,
           **OPTIONS["all"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("grad_in_forward", [1, 0])
def test_parity_low_precision_many_chunks(dtype, grad_in_forward):
    hidden, weight, b, labels = _inputs((2, 29), 40, 300, dtype, bias=True, seed=9)
    plan = dataclasses.replace(make_plan(40, 300, dtype, DEV), chunk_tokens=16,
                               grad_in_forward=grad_in_forward)
    _check(hidden, weight, b, labels, dtype, plan=plan, label_smoothing=0.05, z_loss=1e-3)


@pytest.mark.parametrize("grad_in_forward,reduction", [(1, "mean"), (0, "mean"), (0, "none")])
def test_parity_3d_chunks_and_split(grad_in_forward, reduction):
    """[B, S, H] input, several chunks (one partial), dhidden over a split vocabulary."""
    hidden, weight, b, labels = _inputs((3, 11), 20, 250, torch.float32, seed=3)
    plan = dataclasses.replace(make_plan(20, 250, torch.float32, DEV), chunk_tokens=8,
                               dh_split=3, grad_in_forward=grad_in_forward)
    _check(hidden, weight, b, labels, torch.float32, plan=plan, logit_softcap=5.0,
           reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_gives_zero_not_nan(reduction):
    hidden, weight, b, labels = _inputs((9,), 8, 11, torch.float32, bias=True)
    labels = torch.full_like(labels, -100)
    loss = lm_head_loss_det(hidden, weight, labels, bias=b, reduction=reduction, z_loss=0.1)
    assert torch.equal(loss, torch.zeros_like(loss))
    loss.sum().backward()
    for t in (hidden, weight, b):
        assert torch.equal(t.grad, torch.zeros_like(t)), "gradients of ignored rows must be 0"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_zero_tokens(reduction):
    hidden, weight, b, _ = _inputs((0,), 8, 11, torch.float32, bias=True)
    labels = torch.zeros((0,), dtype=torch.int64, device=DEV)
    loss, lse = lm_head_loss_det(hidden, weight, labels, bias=b, reduction=reduction,
                                 return_lse=True)
    assert lse.shape == (0,)
    if reduction == "none":
        assert loss.shape == (0,)
    else:
        assert loss.shape == () and float(loss.detach()) == 0.0
    loss.sum().backward()
    assert hidden.grad.shape == (0, 8)
    assert torch.equal(weight.grad, torch.zeros_like(weight))
    assert torch.equal(b.grad, torch.zeros_like(b))


def test_custom_ignore_index_and_matches_torch_cross_entropy():
    hidden, weight, _, labels = _inputs((25,), 12, 50, torch.float32, ignore_every=0)
    labels[::3] = 7  # 7 is also a real class: ignored here
    loss = lm_head_loss_det(hidden, weight, labels, ignore_index=7, label_smoothing=0.1)
    ref = torch.nn.functional.cross_entropy((hidden @ weight.T).float(), labels, ignore_index=7,
                                            label_smoothing=0.1)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grad_in_forward", [1, 0])
def test_outputs_are_fully_written(monkeypatch, grad_in_forward):
    """Poison every buffer the entry allocates: a skipped element would stay NaN."""
    import cake_lm_head_loss_det_train.api as api
    from cake_core.testing import poison_

    real_empty = torch.empty

    def poisoned_empty(*a, **k):
        t = real_empty(*a, **k)
        return poison_(t) if t.is_floating_point() else t

    monkeypatch.setattr(api.torch, "empty", poisoned_empty)
    hidden, weight, b, labels = _inputs((45,), 20, 130, torch.float16, bias=True, seed=21)
    plan = dataclasses.replace(make_plan(20, 130, torch.float16, DEV), chunk_tokens=16,
                               dh_split=2, grad_in_forward=grad_in_forward)
    loss, lse = lm_head_loss_det(hidden, weight, labels, bias=b, plan=plan, return_lse=True)
    loss.backward()
    for t in (loss, lse, hidden.grad, weight.grad, b.grad):
        assert torch.isfinite(t.float()).all()


def test_fp16_gradients_keep_small_probabilities_under_a_loss_scale():
    # fp16 (5 exponent bits): gradients computed in the forward for an upstream gradient of
    # 1 (and / T for "mean") would flush small probabilities to 0 before a loss scale lifts
    # them; the rule computes fp16 gradients in the backward, where the scale is known
    assert make_plan(16, 50, torch.float16, DEV).grad_in_forward == 0
    assert make_plan(16, 50, torch.bfloat16, DEV).grad_in_forward == 1
    g = torch.Generator().manual_seed(0)
    T, H, V, scale = 256, 16, 50, 65536.0  # torch.amp.GradScaler's initial scale
    h0 = torch.randn(T, H, generator=g)
    h0[:, 0] = 2.0
    w0 = torch.randn(V, H, generator=g) * 0.1
    w0[:, 0] = 0.0
    w0[7, 0] = -4.6  # class 7: p ~ 2e-6 for every token, p / T under fp16's subnormals
    y = torch.randint(0, V, (T,), generator=g)
    y[y == 7] = 8

    def dw(fn, dtype):
        h = h0.to(DEV, dtype).requires_grad_()
        w = w0.to(DEV, dtype).requires_grad_()
        (fn(h, w, y.to(DEV)) * scale).backward()
        return w.grad.double() / scale

    got = dw(lambda h, w, y: lm_head_loss_det(h, w, y), torch.float16)
    ref = dw(lambda h, w, y: torch.nn.functional.cross_entropy(h @ w.T, y), torch.float64)
    assert float(got[7].abs().max()) > 0.0
    assert rel_fro_error(got[7], ref[7]) < 1e-2
    assert rel_fro_error(got, ref) < 1e-2


@pytest.mark.parametrize("cap", [1e4, 1e6])
def test_large_soft_caps_stay_exact(cap):
    # c * tanh(z / c) ~ z: tanh near 0 without cancellation (cake_core.triton_utils.tanh)
    hidden, weight, b, labels = _inputs((12,), 16, 50, torch.float32, seed=9)
    _check(hidden, weight, b, labels, torch.float32, tol=1e-5, logit_softcap=cap)
