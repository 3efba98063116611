"""Shared input factory and runners of the cake-causal-conv1d-det-train tests (fresh random
values, never zeros)."""

from types import SimpleNamespace

import pytest
import torch
from cake_causal_conv1d_det_train import causal_conv1d_det, causal_conv1d_reference
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()
# packed documents: empty, length 1, shorter than W - 1, around W, and long ones (one spans
# two 32-token blocks, neither is a multiple of 32: CPU plans use 32-token blocks)
CU_RAGGED = (0, 0, 1, 3, 7, 47, 75)


def make_inputs(B, T, D, W, dtype=torch.float32, *, cu=None, bias=True, h0=True, seed=0,
                param_dtype=None):
    """x, weight, bias, initial state, cu_seqlens and upstream gradients (dy, dfinal)."""
    N = B if cu is None else len(cu) - 1
    pdt = param_dtype or dtype
    return SimpleNamespace(
        x=randn((B, T, D), dtype, DEV, seed=seed),
        weight=randn((D, W), pdt, DEV, seed=seed + 1, scale=0.5),
        bias=randn((D,), pdt, DEV, seed=seed + 2) if bias else None,
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


def run_cake(inp, activation=None, output_final_state=True, **kw):
    """Forward and backward through the autograd entry; dict of outputs and gradients."""
    x, w, b, h0 = _leaves(inp)
    y, fs = causal_conv1d_det(x, w, b, activation=activation, cu_seqlens=inp.cu,
                              initial_state=h0, output_final_state=output_final_state, **kw)
    outs, grads = [y], [inp.dy]
    if output_final_state:
        outs.append(fs)
        grads.append(inp.dfs)
    torch.autograd.backward(outs, grads)
    return dict(y=y.detach(), fs=fs.detach() if fs is not None else None, dx=x.grad,
                dweight=w.grad, dbias=b.grad if b is not None else None,
                dh0=h0.grad if h0 is not None else None)


def run_reference(inp, activation=None, output_final_state=True):
    """The same in float64 through reference.py and torch autograd."""
    x, w, b, h0 = _leaves(inp, torch.float64)
    y, fs = causal_conv1d_reference(x, w, b, activation=activation, cu_seqlens=inp.cu,
                                    initial_state=h0, output_final_state=output_final_state,
                                    dtype=torch.float64)
    outs, grads = [y], [inp.dy.double()]
    if output_final_state:
        outs.append(fs)
        grads.append(inp.dfs.double())
    torch.autograd.backward(outs, grads)
    return dict(y=y.detach(), fs=fs.detach() if fs is not None else None, dx=x.grad,
                dweight=w.grad, dbias=b.grad if b is not None else None,
                dh0=h0.grad if h0 is not None else None)


@pytest.fixture
def conv():
    return SimpleNamespace(make_inputs=make_inputs, run_cake=run_cake,
                           run_reference=run_reference, DEV=DEV, CU_RAGGED=CU_RAGGED)
