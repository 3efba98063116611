"""Candidate for issue 45 (host time per call): launch a Triton kernel through its compiled
launcher on a cache hit, without ``JITFunction.run``'s binder, option parsing and cache-key
string.

On an H100 host a keyword launch through ``kernel[grid](...)`` took ~35 us, the compiled
launcher called directly ~5-6 us (docs/benchmarks/host_overhead.md); about 30 us of a launch
is Triton's Python around it. This module keeps, per kernel, a dictionary from a key cake
computes in Python to the ``CompiledKernel`` Triton chose for that key the first time:

- the key holds, per non-constexpr argument, everything Triton 3.6 specializes on (a tensor's
  dtype and whether its address is a multiple of 16; an int's range class, whether it is 1,
  whether it is a multiple of 16; a host tensor descriptor's dtype, block shape and padding;
  the type of floats, bools and None), every constexpr's value, the launch options given
  (``num_warps``...), and the current device: finer than Triton's own key, so two calls with
  one key get the kernel Triton would pick (``shared/tests/test_fast_launch.py`` checks that
  against Triton's binder on a CPU);
- a miss (and anything unusual: launch hooks set, debug, a grid or argument form it does not
  know) goes through ``JITFunction.run`` itself, which compiles if needed and launches; its
  kernel is then kept under the key;
- a hit calls ``CompiledKernel.run`` with the same arguments ``JITFunction.run`` passes.

Not checked on a hit (``JITFunction.run`` checks them): that the kernel's global constants
are unchanged (cake's kernels read none that change).

Use (an experiment; nothing in a package imports this):

    import fast_launch; fast_launch.install()            # every JITFunction in the process
    fast_launch.install(check=True)                      # and on every hit also ask Triton's
                                                         # own cache; a different kernel raises
    pytest -p fast_launch ...                            # the same as a pytest plugin
                                                         # (CAKE_FAST_LAUNCH_CHECK=1: check)
"""
from __future__ import annotations

import inspect
import os

from triton import knobs
from triton.knobs import HookChain
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction, compute_cache_key

_ORIGINAL_RUN = JITFunction.run
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
STATS = {"hit": 0, "miss": 0, "slow": 0, "checked": 0}
_CHECK = False
_EMPTY = inspect.Parameter.empty


class _Unknown(Exception):
    """An argument whose specialization this module does not mirror: take Triton's path."""


def arg_key(v):
    """The part of the key for one non-constexpr argument ``v``: a value that determines
    Triton 3.6's specialization of ``v`` (``native_specialize_impl``)."""
    t = type(v)
    if t is bool:
        return ("u1",)
    if t is int:
        if v == 1:
            return 1  # Triton makes it a constexpr
        if _I32_MIN <= v <= _I32_MAX:
            rng = 0
        elif _I64_MIN <= v <= _I64_MAX:
            rng = 1
        elif 0 <= v <= _U64_MAX:
            rng = 2
        else:
            raise _Unknown
        return (rng, v % 16 == 0)
    if t is float:
        return ("fp32",)
    if v is None:
        return None
    if hasattr(v, "data_ptr"):  # torch.Tensor, nn.Parameter, anything Triton treats alike
        return (v.dtype, v.data_ptr() % 16 == 0)
    if t.__name__ == "TensorDescriptor":  # triton.tools.tensor_descriptor's host descriptor
        return ("desc", v.base.dtype, tuple(v.block_shape), getattr(v, "padding", None))
    raise _Unknown


class _KernelInfo:
    """What the fast path needs of one JITFunction, computed once."""

    __slots__ = ("names", "nameset", "constexpr", "defaults", "cache")

    def __init__(self, fn: JITFunction):
        self.names = [p.name for p in fn.params]
        self.nameset = frozenset(self.names)
        self.constexpr = [bool(p.is_constexpr) for p in fn.params]
        self.defaults = [p.default for p in fn.params]  # inspect.Parameter.empty: none
        self.cache = {}


def bound_values(info: _KernelInfo, args, kwargs):
    """(every parameter's value in signature order, the options given) as Triton's binder
    binds them; raises _Unknown where a parameter has no value."""
    n = len(args)
    if n > len(info.names):
        raise _Unknown
    vals = list(args)
    for i in range(n, len(info.names)):
        name = info.names[i]
        if name in kwargs:
            vals.append(kwargs[name])
        elif info.defaults[i] is _EMPTY:
            raise _Unknown
        else:
            vals.append(info.defaults[i])
    opts = tuple((k, v) for k, v in kwargs.items() if k not in info.nameset)
    return vals, opts


def launch_key(info: _KernelInfo, vals, opts, device):
    return (device, opts, tuple(v if c else arg_key(v) for v, c in zip(vals, info.constexpr, strict=True)))


def current_device():
    return driver.active.get_current_device()


def current_stream(device):
    return driver.active.get_current_stream(device)


def _triton_choice(fn: JITFunction, args, kwargs):
    """The CompiledKernel Triton's own cache holds for this call (None: not compiled)."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    device = current_device()
    kernel_cache, kernel_key_cache, _, _, binder = fn.device_caches[device]
    _, specialization, options = binder(*args, **kwargs)
    return kernel_cache.get(compute_cache_key(kernel_key_cache, specialization, options))


def _hooked(hook) -> bool:
    """Whether a launch hook would run (Triton 3.6 keeps an empty HookChain when none is set;
    its launcher skips a hook given as None, so the fast path passes None)."""
    return hook is not None and (not isinstance(hook, HookChain) or bool(hook.calls))


def fast_run(self, *args, grid, warmup, **kwargs):
    """JITFunction.run with the cached fast path (see the module's docstring)."""
    if (warmup or _hooked(knobs.runtime.launch_enter_hook)
            or _hooked(knobs.runtime.launch_exit_hook) or knobs.runtime.debug
            or self.debug or knobs.compilation.instrumentation_mode not in (None, "", "none")):
        STATS["slow"] += 1
        return _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
    info = self.__dict__.get("_cake_fast")
    if info is None:
        info = self._cake_fast = _KernelInfo(self)
    try:
        vals, opts = bound_values(info, args, kwargs)
        device = current_device()
        key = launch_key(info, vals, opts, device)
        entry = info.cache.get(key)
    except (_Unknown, TypeError):  # TypeError: an unhashable option or constexpr
        STATS["slow"] += 1
        return _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
    if entry is None:
        STATS["miss"] += 1
        kernel = _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
        if kernel is not None and not hasattr(kernel, "result"):  # not an async compile
            info.cache[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata)
        return kernel
    kernel, run, function, packed = entry
    if _CHECK:
        if _triton_choice(self, args, kwargs) is not kernel:
            raise AssertionError(f"fast_launch: {self.__name__}: the cached kernel is not the "
                                 f"one Triton's cache holds for this call (key {key!r})")
        STATS["checked"] += 1
    if callable(grid):
        grid = grid(dict(zip(info.names, vals, strict=True)))
    n = len(grid)
    STATS["hit"] += 1
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
        current_stream(device), function, packed, None, None, None, *vals)
    return kernel


def install(check: bool = False) -> None:
    """Route every JITFunction launch in this process through ``fast_run``."""
    global _CHECK
    _CHECK = check
    JITFunction.run = fast_run


def uninstall() -> None:
    JITFunction.run = _ORIGINAL_RUN


def pytest_configure(config):  # as a pytest plugin: ``pytest -p fast_launch``
    install(check=os.environ.get("CAKE_FAST_LAUNCH_CHECK") == "1")


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"fast_launch: {STATS}")
