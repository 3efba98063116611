"""shared/gpu/fast_launch.py on a CPU: its key determines Triton's specialization, it binds
arguments as Triton's binder does, and its hit path calls the compiled launcher with what
``JITFunction.run`` would pass (a stand-in kernel; the real launch is for the GPU)."""
import itertools
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fast_launch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))


def _kernel(X, Y, n, m, f, flag, maybe, D, B: tl.constexpr, C: tl.constexpr = 4, s=7):
    pass


KERNEL = JITFunction(_kernel)  # a JITFunction whatever TRITON_INTERPRET says


def _values():
    base = torch.empty(4096, dtype=torch.float32)
    bf = torch.empty(64, 64, dtype=torch.bfloat16)
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, (1 << 31) - 1, 1 << 31, (1 << 31) + 16,
            -(1 << 31), -(1 << 31) - 1, -(1 << 31) - 16, (1 << 32), (1 << 63) - 1, 1 << 63,
            (1 << 63) + 16, (1 << 64) - 1, (1 << 64) - 16]
    tensors = [base, base[1:], base[4:], base[3:], base.to(torch.float16),
               base.to(torch.float16)[8:], base.to(torch.float16)[1:], bf, bf[1:]]
    descs = [TensorDescriptor(bf, [64, 64], [64, 1], [16, 32]),
             TensorDescriptor(bf[8:], [56, 64], [64, 1], [16, 32]),
             TensorDescriptor(bf, [64, 64], [64, 1], [32, 32]),
             TensorDescriptor(bf.float(), [64, 64], [64, 1], [16, 32])]
    return ints + tensors + descs + [0.5, 1.0, 3, True, False, None]


def test_equal_keys_give_equal_specializations():
    seen = {}
    for v in _values():
        try:
            k = fast_launch.arg_key(v)
        except fast_launch._Unknown:
            continue
        spec = native_specialize_impl(BACKEND, v, False, True, True)
        assert seen.setdefault(k, spec) == spec, (v, k, spec, seen[k])
    assert len(seen) >= 15  # the pool exercised many classes


def test_a_key_tells_apart_what_triton_tells_apart():
    # the converse is not needed for correctness; it keeps hits frequent: same Triton spec,
    # few keys
    for a, b in itertools.combinations(_values(), 2):
        try:
            ka, kb = fast_launch.arg_key(a), fast_launch.arg_key(b)
        except fast_launch._Unknown:
            continue
        sa = native_specialize_impl(BACKEND, a, False, True, True)
        sb = native_specialize_impl(BACKEND, b, False, True, True)
        if sa != sb:
            assert ka != kb, (a, b)


def _calls():
    x = torch.empty(256)
    y = torch.empty(256, dtype=torch.bfloat16)
    d = TensorDescriptor(y.view(16, 16), [16, 16], [16, 1], [16, 16])
    yield (x, y, 5, 16, 0.5, True, None, d), dict(B=64)
    yield (x, y[1:], 1, 32, 0.5, False, x, d), dict(B=64, C=8, num_warps=4)
    yield (x,), dict(Y=y, n=7, m=1 << 33, f=2.0, flag=True, maybe=None, D=d, B=32, s=1)
    yield (x, y, 5, 16, 0.5, True, None, d, 16, 2, 48), dict(num_stages=3, num_warps=8)
    yield (x[2:], y, -3, 0, 1.5, False, y, d), dict(C=4, B=64, num_warps=4)


def test_binding_and_keys_agree_with_tritons_binder():
    binder = create_function_from_signature(KERNEL.signature, KERNEL.params, BACKEND)
    info = fast_launch._KernelInfo(KERNEL)
    keys = {}
    for args, kwargs in _calls():
        bound, spec, options = binder(*args, **kwargs)
        vals, opts = fast_launch.bound_values(info, args, kwargs)
        assert len(vals) == len(bound)
        assert all(a is b for a, b in zip(vals, bound.values(), strict=True))
        assert dict(opts) == options
        key = fast_launch.launch_key(info, vals, opts, 0)
        triton_key = (tuple(spec), str(options))
        assert keys.setdefault(key, triton_key) == triton_key


def test_missing_argument_takes_tritons_path():
    info = fast_launch._KernelInfo(KERNEL)
    with pytest.raises(fast_launch._Unknown):
        fast_launch.bound_values(info, (torch.empty(4),), dict(B=1))


class _FakeCompiled:
    def __init__(self):
        self.launches = []
        self.function, self.packed_metadata = "fn-handle", ("meta",)

    def run(self, *a):
        self.launches.append(a)


@pytest.fixture
def fake(monkeypatch):
    made = []

    def original(fn, *args, grid, warmup, **kwargs):
        k = _FakeCompiled()
        made.append((k, args, kwargs))
        return k

    monkeypatch.setattr(fast_launch, "_ORIGINAL_RUN", original)
    monkeypatch.setattr(fast_launch, "current_device", lambda: 0)
    monkeypatch.setattr(fast_launch, "current_stream", lambda dev: 1234)
    monkeypatch.setattr(fast_launch, "_CHECK", False)
    kern = JITFunction(_kernel)
    return kern, made


def test_hit_launches_the_kept_kernel_with_what_triton_passes(fake):
    kern, made = fake
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
    kern, made = fake
    x = torch.empty(256)
    call = lambda *a, **k: fast_launch.fast_run(kern, *a, grid=(1,), warmup=False, **k)
    call(x, x, 5, 16, 0.5, True, None, x, B=64)
    call(x, x, 5, 16, 0.5, True, None, object(), B=64)  # not a type it mirrors
    call(x, x, 5, 16, 0.5, True, None, x, B=[1])  # unhashable constexpr
    monkeypatch.setattr(fast_launch.knobs.runtime.launch_enter_hook, "calls", [print])
    call(x, x, 5, 16, 0.5, True, None, x, B=64)
    assert len(made) == 4 and all(k.launches == [] for k, _, _ in made)
