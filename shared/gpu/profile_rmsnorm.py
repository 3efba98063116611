"""Where does RMSNorm fwd+bwd time go? Host time, device time and the kernel list per impl.

For cake, Liger and FLA at one T×H (bf16, x and weight requiring grad), prints:
- do_bench fwd+bwd (eager, L2 flushed) and the same captured in a CUDA graph (device only);
- host time per fwd+bwd call (perf_counter around the Python call, GPU idle before it);
- cake's kernels launched directly (no autograd, no checks);
- the CUDA kernels one fwd+bwd launches, with their device times (torch.profiler).

Usage (repo root, GPU): python3 shared/gpu/profile_rmsnorm.py [T H]
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import time

import cake_core.triton_utils  # noqa: F401  (backend first)
import torch
from cake_core.bench import capture_cuda_graph, cuda_profile
from triton.testing import do_bench

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "packages/cake-rmsnorm-det-train/benchmarks/bench_cake_rmsnorm_det_train.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_rmsnorm", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_ms(fn):
    return do_bench(capture_cuda_graph(fn).replay, warmup=25, rep=100)


def host_us(fn, n=50):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2] * 1e6


def kernels(fn, n=5):
    prof = cuda_profile(fn, warmup=1, iters=n)
    rows = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0:
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if t > 0:
                rows.append((t / n, e.count // n, e.key[:90]))
    rows.sort(reverse=True)
    return rows


def fwd_paths():
    """Kernel-only forward: a direct kernel launch vs the family's launch function (run on
    2026-11-29 against a since-reverted one-row/even-H kernel path: 134.4 vs 135.3 us at
    32768x4096, no gain, same bits)."""
    from cake_rmsnorm_det_train.api import _launch_fwd
    from cake_rmsnorm_det_train.kernels.fwd import rmsnorm_fwd_kernel
    from cake_rmsnorm_det_train.plan import make_plan

    for T, H in ((32768, 4096), (65536, 2048), (16384, 8192)):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = (1 + 0.1 * torch.randn(H, device="cuda")).bfloat16()
        plan = make_plan(H, torch.bfloat16, x.device)
        y = torch.empty_like(x)
        rstd = torch.empty(T, device="cuda")

        def generic():
            rmsnorm_fwd_kernel[(-(-T // plan.block_m_fwd),)](
                x, x, w, y, y, rstd, T, H, H, H, H, H, 1e-6, HAS_RESIDUAL=False,
                BLOCK_M=plan.block_m_fwd, BLOCK_H=plan.block_h, OFF64=False,
                num_warps=plan.num_warps_fwd)

        def current():
            return _launch_fwd(x, w, None, 1e-6, plan)

        generic()
        y0 = y.clone()
        y1 = current()[0]
        print(f"fwd kernel T={T} H={H}: generic 2-D {do_bench(generic, warmup=25, rep=100)*1e3:.1f} us"
              f", current {do_bench(current, warmup=25, rep=100)*1e3:.1f} us, "
              f"y max diff {float((y0.float() - y1.float()).abs().max()):.3g}, "
              f"bitwise {torch.equal(y0, y1)}", flush=True)


def main():
    if sys.argv[1:2] == ["fwd"]:
        return fwd_paths()
    T, H = (int(a) for a in sys.argv[1:3]) if len(sys.argv) >= 3 else (32768, 4096)
    bench = load_bench()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).bfloat16().requires_grad_()
    dy = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
    print(f"T={T} H={H} bf16  torch {torch.__version__}")
    fns = {}
    for name in ("cake", "liger", "fla", "torch_eager"):
        impl = bench.IMPL_CLASSES[name](name)
        impl.try_load()
        if impl.import_error:
            print(name, "import error", impl.import_error)
            continue
        f = impl.make_fn(1e-6)
        fns[name] = f

    from cake_rmsnorm_det_train.api import _launch_bwd, _launch_fwd
    from cake_rmsnorm_det_train.plan import make_plan

    plan = make_plan(H, torch.bfloat16, x.device)
    xd, wd = x.detach(), w.detach()

    def cake_direct():
        y, _, rstd = _launch_fwd(xd, wd, None, 1e-6, plan)
        return _launch_bwd(dy, None, xd, wd, rstd, plan, None, None)

    def cake_direct_fwd():
        return _launch_fwd(xd, wd, None, 1e-6, plan)

    print(f"plan {plan.to_dict()}")
    for name, f in fns.items():
        def fb(f=f):
            y = f(x, w)
            return torch.autograd.grad(y, (x, w), dy)

        def fwd(f=f):
            return f(x, w)

        fb()
        torch.cuda.synchronize()
        r = {"f+b": do_bench(fb, warmup=25, rep=100), "fwd": do_bench(fwd, warmup=25, rep=100)}
        try:
            r["f+b graph"] = graph_ms(fb)
        except Exception as e:  # noqa: BLE001
            r["f+b graph"] = f"error {type(e).__name__}"
        r["host us f+b"] = host_us(fb)
        r["host us fwd"] = host_us(fwd)
        print(name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
        for t, c, k in kernels(fb)[:8]:
            print(f"    {t:9.1f} us  x{c}  {k}")
    r = {"f+b direct": do_bench(cake_direct, warmup=25, rep=100),
         "fwd direct": do_bench(cake_direct_fwd, warmup=25, rep=100),
         "f+b direct graph": graph_ms(cake_direct),
         "host us f+b direct": host_us(cake_direct)}
    print("cake_direct", {k: round(v, 4) for k, v in r.items()})
    for t, c, k in kernels(cake_direct)[:8]:
        print(f"    {t:9.1f} us  x{c}  {k}")


if __name__ == "__main__":
    main()
