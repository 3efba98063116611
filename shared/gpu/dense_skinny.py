"""Issue 45's skinny dense case on one GPU: where the det fwd+bwd's time goes beside cuBLAS.

    python shared/gpu/dense_skinny.py [--profile]

At (M, N, K) = (4096, 128, 8192) bf16 and at a tiny (256, 256, 256): fwd+bwd of
``dense_projection_det``, ``dense_projection_nondet`` and ``F.linear`` (cuBLAS), each
``x.grad`` / ``w.grad`` reset between calls:

- ``bench ms``: ``triton.testing.do_bench`` median (L2 flushed between calls);
- ``loop ms``: 100 calls issued back to back, then one synchronize (no flush; what a
  training loop sees);
- ``host us``: the same loop's host time per call before the synchronize;
- a ``torch.profiler`` trace of one call: each kernel's duration and the host span.

``--profile``: cProfile of 200 det fwd+bwd calls at the tiny shape with autograd's
multithreading off (the backward then runs on this thread, so its Python is in the
profile), functions by cumulative time.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing
from cake_dense_projection_det_gemm import dense_projection_det
from cake_dense_projection_nondet_gemm import dense_projection_nondet
from torch.profiler import ProfilerActivity, profile

DEV, DT = "cuda", torch.bfloat16


def impls():
    return {"det": dense_projection_det, "nondet": dense_projection_nondet,
            "torch": lambda x, w: F.linear(x, w)}


def step_fn(f, x, w, dy):
    def step():
        x.grad = w.grad = None
        f(x, w).backward(dy)
    return step


def loop(step, n=100, rounds=3):
    host, wall = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / n * 1e6)
        wall.append((t2 - t0) / n * 1e3)
    return statistics.median(host), statistics.median(wall)


def kernels(step):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    ks = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [(e.name[:60], e.device_time) for e in ks]


def shape(M, N, K):
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(M, K, device=DEV, dtype=DT, generator=g).requires_grad_()
    w = (torch.randn(N, K, device=DEV, dtype=DT, generator=g) * K ** -0.5).requires_grad_()
    dy = torch.randn(M, N, device=DEV, dtype=DT, generator=g)
    print(f"== (M, N, K) = ({M}, {N}, {K}) bf16", flush=True)
    for name, f in impls().items():
        step = step_fn(f, x, w, dy)
        for _ in range(5):
            step()
        ms = triton.testing.do_bench(step, warmup=25, rep=200)
        host, wall = loop(step)
        print(f"{name:7s} bench {ms:.4f} ms  loop {wall:.4f} ms  host {host:.1f} us/call",
              flush=True)
        for kname, us in kernels(step):
            print(f"    {us:8.1f} us  {kname}")


def cprofile():
    import cProfile
    import io
    import pstats

    torch.autograd.set_multithreading_enabled(False)
    x = torch.randn(256, 256, device=DEV, dtype=DT).requires_grad_()
    w = torch.randn(256, 256, device=DEV, dtype=DT).requires_grad_()
    dy = torch.randn(256, 256, device=DEV, dtype=DT)
    for name in ("det", "torch"):
        step = step_fn(impls()[name], x, w, dy)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        print(f"== {name}: host us per fwd+bwd, autograd on this thread: "
              f"{loop(step)[0]:.1f}", flush=True)
        if name != "det":
            continue
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            step()
        pr.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(45)
        body = buf.getvalue()
        print(body[body.find("ncalls"):].replace("/usr/local/lib/python3.12/dist-packages/",
                                                  "")[:9000], flush=True)
    torch.autograd.set_multithreading_enabled(True)


def main():
    print("torch", torch.__version__, "triton", triton.__version__,
          torch.cuda.get_device_name(), flush=True)
    shape(4096, 128, 8192)
    shape(256, 256, 256)
    if "--profile" in sys.argv:
        cprofile()


if __name__ == "__main__":
    main()
