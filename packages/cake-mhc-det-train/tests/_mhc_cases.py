"""Shared inputs and the float64 reference of the mHC tests (written here, independent of
the package's reference.py): plain-domain Sinkhorn on exp(h_res) with no max subtraction,
autograd through every iteration."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_mhc_det_train import mhc_det_finish, mhc_det_prepare

DEV = default_device()
F64 = torch.float64


def make(T, n, C, dtype, *, seed=0, lead=None, res_bias=None, alpha=(0.8, 1.1, 1.3)):
    """Inputs of one case. ``lead`` replaces [T] by a leading shape (e.g. (2, 5));
    ``res_bias`` sets the res part of the bias (e.g. +-50)."""
    M = 2 * n + n * n
    shape = (*(lead if lead is not None else (T,)), n, C)
    X = randn(shape, dtype, DEV, seed=seed)
    phi = randn((n * C, M), torch.float32, DEV, seed=seed + 1, scale=(n * C) ** -0.5 * 2)
    alpha_t = torch.tensor(alpha, dtype=torch.float32, device=DEV)
    bias = randn((M,), torch.float32, DEV, seed=seed + 2, scale=0.5)
    if res_bias is not None:
        bias[2 * n:] = res_bias
    W = randn((C, C), torch.float32, DEV, seed=seed + 3, scale=C ** -0.5)
    dY = randn(shape, dtype, DEV, seed=seed + 4)
    return {"X": X, "phi": phi, "alpha": alpha_t, "bias": bias, "W": W, "dY": dY}


def branch(U, W):
    """The branch F outside the kernels: fp32 math, result in U's dtype."""
    return torch.tanh(U.float() @ W.float()).to(U.dtype)


def _round_st(t, dtype):
    """t rounded to ``dtype`` in the forward, identity in the backward (the dtype boundaries
    the kernels have: U and B live in X's dtype)."""
    return t + (t.to(dtype).to(t.dtype) - t).detach()


def ref_coefficients(X, phi, alpha, bias, iters=20, eps=1e-6):
    n, C = X.shape[-2], X.shape[-1]
    x = X.reshape(*X.shape[:-2], n * C)
    mix = (x @ phi) / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    h_pre = alpha[0] * mix[..., :n] + bias[:n]
    h_post = alpha[1] * mix[..., n:2 * n] + bias[n:2 * n]
    h_res = (alpha[2] * mix[..., 2 * n:] + bias[2 * n:]).reshape(*X.shape[:-2], n, n)
    m = torch.exp(h_res)
    for _ in range(iters):
        m = m / m.sum(-1, keepdim=True)   # every row by its sum
        m = m / m.sum(-2, keepdim=True)   # then every column by its sum
    return torch.sigmoid(h_pre), 2 * torch.sigmoid(h_post), m


def ref_run(case, iters=20, eps=1e-6):
    """float64 forward and autograd backward of loss = sum(Y * dY):
    returns dict of U, Y, H_pre, H_post, H_res, B and grads of X, phi, alpha, bias, B."""
    X, phi, alpha, bias = (case[k].detach().to(F64).requires_grad_()
                           for k in ("X", "phi", "alpha", "bias"))
    H_pre, H_post, H_res = ref_coefficients(X, phi, alpha, bias, iters, eps)
    dt = case["X"].dtype
    U = torch.einsum("...i,...ic->...c", H_pre, X)
    B = _round_st(torch.tanh(_round_st(U, dt) @ case["W"].to(F64)), dt)
    B.retain_grad()
    Y = H_post[..., :, None] * B[..., None, :] + torch.einsum("...ji,...ic->...jc", H_res, X)
    (Y * case["dY"].to(F64)).sum().backward()
    return {"U": U.detach(), "Y": Y.detach(), "H_pre": H_pre.detach(),
            "H_post": H_post.detach(), "H_res": H_res.detach(), "dX": X.grad, "dphi": phi.grad,
            "dalpha": alpha.grad, "dbias": bias.grad, "dB": B.grad}


def cake_run(case, iters=20, eps=1e-6, plan=None, workspace=None):
    """The same through mhc_det_prepare / mhc_det_finish (X's dtype)."""
    X, phi, alpha, bias = (case[k].detach().clone().requires_grad_()
                           for k in ("X", "phi", "alpha", "bias"))
    U, handle = mhc_det_prepare(X, phi, alpha, bias, eps=eps, sinkhorn_iters=iters, plan=plan,
                                workspace=workspace)
    B = branch(U, case["W"])
    B.retain_grad()
    Y = mhc_det_finish(X, B, handle)
    (Y.float() * case["dY"].float()).sum().backward()
    n = X.shape[-2]
    coef = handle.coef.detach()
    return {"U": U.detach(), "Y": Y.detach(), "H_pre": coef[:, :n], "H_post": coef[:, n:2 * n],
            "H_res": coef[:, 2 * n:].reshape(-1, n, n), "dX": X.grad, "dphi": phi.grad,
            "dalpha": alpha.grad, "dbias": bias.grad, "dB": B.grad, "handle": handle}
