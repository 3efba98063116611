"""shared/gpu/fast_launch.py on a CPU, with Triton's binder for sm_90 and a stand-in compiled
kernel (the real launch is for the GPU): a hit calls the compiled launcher with what
``JITFunction.run`` passes; whatever Triton specializes on makes a miss; hooks, unhashable
constexprs and missing arguments take Triton's own path."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fast_launch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import (  # noqa: E402
    JITFunction,
    compute_cache_key,
    create_function_from_signature,
)

BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))


def _kernel(X, Y, n, m, f, flag, maybe, D, B: tl.constexpr, C: tl.constexpr = 4, s=7):
    pass


KERNEL = JITFunction(_kernel)  # a JITFunction whatever TRITON_INTERPRET says


class _FakeCompiled:
    def __init__(self):
        self.launches = []
        self.function, self.packed_metadata = "fn-handle", ("meta",)

    def run(self, *a):
        self.launches.append(a)


@pytest.fixture
def fake(monkeypatch):
    """fast_launch with Triton's sm_90 binder and a stand-in for Triton's compile-and-launch
    path that keeps its kernels in a stand-in of Triton's own cache."""
    made = []
    tcache, key_cache = {}, {}

    def triton_key(fn, device, args, kwargs):
        kwargs = dict(kwargs, debug=False, instrumentation_mode="")
        bind = create_function_from_signature(fn.signature, fn.params, BACKEND)
        _, spec, options = bind(*args, **kwargs)
        return tcache, compute_cache_key(key_cache, spec, options)

    def original(fn, *args, grid, warmup, **kwargs):
        try:
            _, tkey = triton_key(fn, 0, args, kwargs)
        except TypeError:  # where Triton's own path raises: a kernel of its own here
            tkey = object()
        k = tcache.get(tkey)
        if k is None:
            k = tcache[tkey] = _FakeCompiled()
            made.append((k, args, kwargs))
        else:
            k.launches.append(("triton's path",))
        return k

    monkeypatch.setattr(fast_launch, "triton_key", triton_key)

    monkeypatch.setattr(fast_launch, "_ORIGINAL_RUN", original)
    monkeypatch.setattr(fast_launch, "current_device", lambda: 0)
    monkeypatch.setattr(fast_launch, "current_stream", lambda dev: 1234)
    monkeypatch.setattr(fast_launch, "_CHECK", False)
    monkeypatch.setattr(fast_launch, "binder", lambda fn, device: create_function_from_signature(
        fn.signature, fn.params, BACKEND))
    kern = JITFunction(_kernel)
    return kern, made, tcache


def test_hit_launches_the_kept_kernel_with_what_triton_passes(fake):
    kern, made, tcache = fake
    x = torch.empty(256)
    y = torch.empty(256, dtype=torch.bfloat16)
    call = lambda *a, grid=(3,), **k: fast_launch.fast_run(kern, *a, grid=grid, warmup=False, **k)
    k1 = call(x, y, 5, 16, 0.5, True, None, x, B=64, num_warps=4)
    assert len(made) == 1 and k1.launches == []  # a miss: Triton's path launched it
    x2, y2 = torch.empty(256), torch.empty(256, dtype=torch.bfloat16)
    k2 = call(x2, y2, 21, 48, 1.5, False, None, x2, B=64, num_warps=4)  # same key
    assert k2 is k1 and len(made) == 1
    assert k1.launches == [(3, 1, 1, 1234, "fn-handle", ("meta",), None, None, None,
                            x2, y2, 21, 48, 1.5, False, None, x2, 64, 4, 7)]
    # each change of what Triton specializes on is a miss
    call(x[1:], y2, 21, 48, 1.5, False, None, x2, B=64, num_warps=4)  # alignment
    call(x2, y2, 1, 48, 1.5, False, None, x2, B=64, num_warps=4)  # an int equal to 1
    call(x2, y2, 21, 47, 1.5, False, None, x2, B=64, num_warps=4)  # not a multiple of 16
    call(x2, y2, 21, 48, 1.5, False, None, x2, B=128, num_warps=4)  # a constexpr
    call(x2, y2, 21, 48, 1.5, False, None, x2, B=64, num_warps=8)  # an option
    call(x2, y2, 21, 48, 1.5, False, x2, x2, B=64, num_warps=4)  # None -> tensor
    call(x2, y2.float(), 21, 48, 1.5, False, None, x2, B=64, num_warps=4)  # dtype
    assert len(made) == 8
    # a callable grid sees every parameter by name, as Triton's bound arguments
    seen = []
    call(x2, y2, 21, 48, 1.5, False, None, x2, B=64, num_warps=4,
         grid=lambda meta: seen.append(dict(meta)) or (meta["n"], 2))
    assert seen[0]["B"] == 64 and seen[0]["s"] == 7 and k1.launches[-1][:3] == (21, 2, 1)


def test_hooks_and_unknown_arguments_take_tritons_path(fake, monkeypatch):
    kern, made, tcache = fake
    x = torch.empty(256)
    call = lambda *a, **k: fast_launch.fast_run(kern, *a, grid=(1,), warmup=False, **k)
    call(x, x, 5, 16, 0.5, True, None, x, B=64)
    call(x, x, 5, 16, 0.5, True, None, x, B=[1])  # unhashable constexpr
    call(x, x, 5, 16, 0.5, True, None)  # missing arguments: Triton's path raises
    monkeypatch.setattr(fast_launch.knobs.runtime.launch_enter_hook, "calls", [print])
    call(x, x, 5, 16, 0.5, True, None, x, B=64)
    # the first kernel again, from Triton's cache through Triton's path: no direct launch
    assert len(made) == 3 and made[0][0].launches == [("triton's path",)]
    assert all(k.launches == [] for k, _, _ in made[1:])


def test_a_cleared_triton_cache_recompiles(fake):
    kern, made, tcache = fake
    x = torch.empty(256)
    call = lambda: fast_launch.fast_run(kern, x, x, 5, 16, 0.5, True, None, x, B=64,
                                        grid=(1,), warmup=False)
    k1 = call()
    call()
    assert len(made) == 1 and len(k1.launches) == 1  # a miss, then a hit
    tcache.clear()  # e.g. a test forcing a recompile
    k2 = call()
    assert len(made) == 2 and k2 is not k1 and k2.launches == []  # Triton's path again
    call()
    assert len(k2.launches) == 1


def test_pre_run_hooks_and_global_constants_take_tritons_path(fake, monkeypatch):
    kern, made, tcache = fake
    x = torch.empty(256)
    call = lambda: fast_launch.fast_run(kern, x, x, 5, 16, 0.5, True, None, x, B=64,
                                        grid=(1,), warmup=False)
    seen = []
    kern.add_pre_run_hook(lambda *a, **k: seen.append(1))
    for _ in range(3):
        call()
    assert all(len(k.launches) == 0 or k.launches[-1] == ("triton's path",)
               for k, _, _ in made)
    kern.pre_run_hooks.clear()
    monkeypatch.setattr(kern, "used_global_vals", {("G", 0): (1, {})})
    call()
    call()
    assert all(launch == ("triton's path",) for k, _, _ in made for launch in k.launches)
    assert fast_launch.STATS["slow"] >= 5


def test_a_nan_constexpr_does_not_grow_the_cache_without_bound(fake, monkeypatch):
    kern, made, tcache = fake
    monkeypatch.setattr(fast_launch, "_MAX_KEYS", 3)
    x = torch.empty(256)
    for _ in range(6):
        fast_launch.fast_run(kern, x, x, 5, 16, float("nan"), True, None, x, B=float("nan"),
                             grid=(1,), warmup=False)
    assert len(kern._cake_fast) <= 3
