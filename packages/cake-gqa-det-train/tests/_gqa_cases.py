"""Shared inputs and the float64 reference of the GQA tests."""

from __future__ import annotations

import contextlib

import torch
from cake_core.testing import poisoned_empty, randn
from cake_core.triton_utils import default_device
from cake_gqa_det_train import gqa_det, gqa_reference

DEV = default_device()
F64 = torch.float64
GRADS = ("out", "lse", "dq", "dk", "dv")


def lens_to_cu(lens, dtype=torch.int32):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int64), 0)
    return cu.to(DEV, dtype)


def make(*, lens_q=None, lens_k=None, B=None, Sq=None, Sk=None, Hq=4, Hkv=2, D=64,
         dtype=torch.float32, seed=0):
    """Packed inputs (``lens_q`` / ``lens_k`` per document) or a batch (B, Sq, Sk)."""
    if lens_q is not None:
        lens_k = lens_q if lens_k is None else lens_k
        Tq, Tk = sum(lens_q), sum(lens_k)
        qs, ks = (Tq, Hq, D), (Tk, Hkv, D)
        cu_q, cu_k = lens_to_cu(lens_q), lens_to_cu(lens_k)
    else:
        Sk = Sq if Sk is None else Sk
        qs, ks = (B, Sq, Hq, D), (B, Sk, Hkv, D)
        cu_q = cu_k = None
    q = randn(qs, dtype, DEV, seed=seed)
    k = randn(ks, dtype, DEV, seed=seed + 1)
    v = randn(ks, dtype, DEV, seed=seed + 2)
    do = randn(qs, dtype, DEV, seed=seed + 3)
    return {"q": q, "k": k, "v": v, "do": do, "cu_q": cu_q, "cu_k": cu_k}


def run(fn, case, **kw):
    """out, lse and the gradients of <out, do> through ``fn`` (gqa_det or the reference)."""
    q, k, v = (case[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
    args = (q, k, v)
    if case["cu_q"] is not None:
        args += (case["cu_q"], case["cu_k"])
    out, lse = fn(*args, return_lse=True, **kw) if fn is gqa_det else fn(*args, **kw)
    (out.to(case["do"].dtype) * case["do"]).sum().backward() if fn is gqa_det else \
        (out * case["do"].to(out.dtype)).sum().backward()
    return {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad,
            "dv": v.grad}


def reference(case, **kw):
    """The float64 reference of a case (inputs upcast)."""
    c = dict(case)
    for n in ("q", "k", "v", "do"):
        c[n] = case[n].detach().to(F64)
    return run(gqa_reference, c, **kw)


@contextlib.contextmanager
def poisoned_launch_buffers():
    """:func:`cake_core.testing.poisoned_empty` that reaches the launches too: ``launch``
    binds ``torch.empty`` at import (``launch._empty``), so the block looks it up per call.
    Yields the poisoned allocations' shapes."""
    import cake_gqa_det_train.launch as launch

    real = launch._empty
    launch._empty = lambda *a, **k: torch.empty(*a, **k)
    try:
        with poisoned_empty() as shapes:
            yield shapes
    finally:
        launch._empty = real


def graph_code(gm: torch.fx.GraphModule) -> str:
    """The code of a traced graph and of every subgraph in it (an autograd.Function traced
    by dynamo puts its forward and backward in ``fwd_body_*`` / ``bwd_body_*``)."""
    return "\n".join(m.code for m in gm.modules() if isinstance(m, torch.fx.GraphModule))
