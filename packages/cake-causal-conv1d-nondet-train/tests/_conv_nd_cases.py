"""Inputs and runners of the cake-causal-conv1d-nondet-train tests (fresh random values),
and the float64 reference: cake-causal-conv1d-det-train's ``causal_conv1d_reference``."""

from types import SimpleNamespace

import torch
from cake_causal_conv1d_det_train import causal_conv1d_reference
from cake_causal_conv1d_nondet_train import causal_conv1d_nondet
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()
# packed documents: empty, length 1, shorter than W - 1, and one spanning two 32-token blocks
CU_RAGGED = (0, 0, 1, 3, 40, 47)
NAMES = ("y", "fs", "dx", "dweight", "dbias", "dh0")


def make_inputs(B, T, D, W, dtype=torch.float32, *, cu=None, bias=True, h0=True, seed=0):
    """x, weight, bias, initial state, cu_seqlens and upstream gradients (dy, dfinal)."""
    N = B if cu is None else len(cu) - 1
    return SimpleNamespace(
        x=randn((B, T, D), dtype, DEV, seed=seed),
        weight=randn((D, W), dtype, DEV, seed=seed + 1, scale=0.5),
        bias=randn((D,), dtype, DEV, seed=seed + 2) if bias else None,
        h0=randn((N, D, W - 1), dtype, DEV, seed=seed + 3) if h0 else None,
        cu=torch.tensor(cu, dtype=torch.int32, device=DEV) if cu is not None else None,
        dy=randn((B, T, D), dtype, DEV, seed=seed + 4),
        dfs=randn((N, D, W - 1), dtype, DEV, seed=seed + 5),
    )


def _leaves(inp, dtype=None):
    out = []
    for t in (inp.x, inp.weight, inp.bias, inp.h0):
        if t is None:
            out.append(None)
        else:
            t = t.detach().clone() if dtype is None else t.detach().to(dtype)
            out.append(t.requires_grad_())
    return out


def _run(fn, inp, activation, dtype=None, **kw):
    x, w, b, h0 = _leaves(inp, dtype)
    y, fs = fn(x, w, b, activation=activation, cu_seqlens=inp.cu, initial_state=h0,
               output_final_state=True, **kw)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    torch.autograd.backward([y, fs], [cast(inp.dy), cast(inp.dfs)])
    return dict(y=y.detach(), fs=fs.detach(), dx=x.grad, dweight=w.grad,
                dbias=b.grad if b is not None else None,
                dh0=h0.grad if h0 is not None else None)


def run_nondet(inp, activation=None, **kw):
    """Forward and backward through :func:`causal_conv1d_nondet`."""
    return _run(causal_conv1d_nondet, inp, activation, **kw)


def run_reference(inp, activation=None):
    """The same in float64 through the det package's reference and torch autograd."""
    return _run(lambda *a, **k: causal_conv1d_reference(*a, dtype=torch.float64, **k), inp,
                activation, torch.float64)
