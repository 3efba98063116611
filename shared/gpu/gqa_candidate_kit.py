"""What shared/gpu's GQA candidate scripts (gqa_swapab.py, gqa_onepass.py) share: issue 41's
shapes, packed inputs, gradients through an entry, the relative error, the timers and the
SDPA cuDNN anchor. Dev tooling, ships in no wheel."""
from __future__ import annotations

import os
import time

import torch

# issue 41's shapes: (document lengths, Hq, Hkv, D); the CPU dry runs' tiny ones
SHAPES = {"a": ([4096] * 4, 16, 2, 256), "b": ([4096] * 4, 32, 8, 128),
          "c": ([32768], 16, 16, 128)}
DRY_SHAPES = {"a": ([40, 24], 4, 2, 256), "b": ([40, 24], 4, 2, 128)}


def on_cuda() -> bool:
    """Compiled kernels on a GPU (else the interpreter on the CPU)."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def case(lens, Hq, Hkv, D, dtype, dev, seed=0, lens_k=None):
    """Packed q ``[Tq, Hq, D]``, k, v ``[Tk, Hkv, D]``, dO, cu_seqlens_q, cu_seqlens_k."""
    g = torch.Generator().manual_seed(seed)
    lens_k = lens if lens_k is None else lens_k
    q = torch.randn(sum(lens), Hq, D, generator=g)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g)
    v = torch.randn(sum(lens_k), Hkv, D, generator=g)
    do = torch.randn(sum(lens), Hq, D, generator=g)
    cq = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + lens_k).cumsum(0).to(torch.int32)
    return [t.to(dev, dtype) for t in (q, k, v, do)] + [cq.to(dev), ck.to(dev)]


def grads(fn, q, k, v, do, cq, ck, **kw):
    """``[out, dq, dk, dv]`` of ``fn(q, k, v, cq, ck, **kw)`` for the upstream ``do``."""
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(qq, kk, vv, cq, ck, **kw)
    out.backward(do)
    return [out.detach(), qq.grad, kk.grad, vv.grad]


def rel(a, b) -> float:
    """Relative Frobenius error of ``a`` against the (float64) ``b``."""
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


def do_bench_ms(fn) -> float:
    """Median ms of ``fn`` by triton.testing.do_bench."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=200, return_mode="median")


def once_ms(fn) -> float:
    """A dry run's timer: one call, wall ms (the interpreter's: not a measurement)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def cudnn_fwd_bwd(q, k, v, do, lens, Hq, Hkv, D):
    """A callable of one fwd+bwd of torch's SDPA under its cuDNN backend on the packed
    equal-length documents as a batch (K and V expanded to Hq heads outside the call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S = len(lens), lens[0]
    qb, kb, vb, dob = (x.view(B, S, -1, D).transpose(1, 2) for x in (q, k, v, do))
    leaves = [t.detach().clone().requires_grad_() for t in
              (qb, kb.repeat_interleave(Hq // Hkv, 1), vb.repeat_interleave(Hq // Hkv, 1))]

    def fb():
        for t in leaves:
            t.grad = None
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True
                                                             ).backward(dob)
    return fb
