"""Inputs and the float64 reference of the cake-gqa-train tests."""

from __future__ import annotations

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_gqa_det_train import gqa_reference

DEV = default_device()
DTYPE = torch.float32 if DEV.type == "cpu" else torch.bfloat16


def make(lens_q, lens_k=None, Hq=4, Hkv=2, D=64, seed=0):
    lens_k = lens_q if lens_k is None else lens_k
    cu = [torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(DEV, torch.int32)
          for lens in (lens_q, lens_k)]
    q = randn((sum(lens_q), Hq, D), DTYPE, DEV, seed=seed)
    k = randn((sum(lens_k), Hkv, D), DTYPE, DEV, seed=seed + 1)
    v = randn((sum(lens_k), Hkv, D), DTYPE, DEV, seed=seed + 2)
    do = randn((sum(lens_q), Hq, D), DTYPE, DEV, seed=seed + 3)
    return q, k, v, do, cu[0], cu[1]


def grads(fn, q, k, v, do, cq, ck, **kw):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(qq, kk, vv, cq, ck, **kw)
    out.backward(do.to(out.dtype))
    return [out.detach(), qq.grad, kk.grad, vv.grad]


def reference(q, k, v, do, cq, ck, **kw):
    f = [t.detach().double() for t in (q, k, v, do)]
    return grads(lambda *a, **k2: gqa_reference(*a, **k2)[0], *f, cq, ck, **kw)
