"""Candidate for issue 45 (host time per call): launch a Triton kernel through its compiled
launcher on a cache hit, without the rest of ``JITFunction.run``.

Most of a keyword launch through ``kernel[grid](...)`` is Triton's Python around the
compiled launcher (measurements: docs/benchmarks/host_overhead.md). Besides binding and
specializing the arguments, Triton 3.6's ``JITFunction.run`` builds its cache key as a
string of the options, looks up the device and stream through its driver proxy, checks the
kernel's global constants, builds launch metadata and has the launcher call its (empty)
enter and exit hook chains on every launch. This module keeps, per kernel, a dictionary
from a key to the ``CompiledKernel`` Triton chose the first time:

- the key is Triton's own: its binder's specialization of every argument (dtypes, 16-byte
  alignment, ints equal to 1 or multiples of 16, constexpr values), the launch options given
  (``num_warps``...) and the current device, as a tuple;
- a miss (and anything unusual: launch or pre-run hooks set, debug or instrumentation on,
  a kernel that reads global constants, an unhashable constexpr) goes through
  ``JITFunction.run`` itself, which compiles if needed and launches; its kernel is then kept
  under the key, with the key of Triton's own cache it sits under;
- a hit first checks that Triton's cache still holds that kernel under that key (a cleared
  cache recompiles, as with Triton);
- a hit calls ``CompiledKernel.run`` with the arguments ``JITFunction.run`` passes (hooks
  and launch metadata as None, which the launcher skips).

Like Triton's own cache key, the key treats constexprs that compare equal as one (True, 1
and 1.0).

Use (an experiment; nothing in a package imports this):

    import fast_launch; fast_launch.install()            # every JITFunction in the process
    fast_launch.install(check=True)                      # and on every hit also ask Triton's
                                                         # own cache; a different kernel raises
    PYTHONPATH=shared/gpu/fast_launch_site:...           # installed in every process
                                                         # (CAKE_FAST_LAUNCH_CHECK=1: check)
"""
from __future__ import annotations

from triton import knobs
from triton.knobs import HookChain
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction, compute_cache_key

_ORIGINAL_RUN = JITFunction.run
STATS = {"hit": 0, "miss": 0, "slow": 0, "checked": 0}
_CHECK = False
_MAX_KEYS = 4096  # per kernel


def binder(fn: JITFunction, device):
    """Triton's own argument binder of ``fn`` on ``device`` (built once per device by
    Triton): (bound arguments by name in signature order, specialization, options)."""
    return fn.device_caches[device][4]


def launch_key(specialization, options, device):
    """The cache key: Triton's specialization of every argument (its own C++ specializer's
    output: dtypes, 16-byte alignment, ints equal to 1 or multiples of 16, constexpr values)
    and the launch options given. Triton keys its kernel cache on the same two (with the
    options as a string, which this avoids building on every launch)."""
    return (device, tuple(specialization), tuple(options.items()))


def current_device():
    return driver.active.get_current_device()


def current_stream(device):
    return driver.active.get_current_stream(device)


def triton_key(fn: JITFunction, device, args, kwargs):
    """(Triton's own kernel cache of ``fn`` on ``device``, the key JITFunction.run would look
    this call up under), with the options Triton adds itself."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kernel_cache, kernel_key_cache, _, _, bind = fn.device_caches[device]
    _, specialization, options = bind(*args, **kwargs)
    return kernel_cache, compute_cache_key(kernel_key_cache, specialization, options)


def _hooked(hook) -> bool:
    """Whether a launch hook would run (Triton 3.6 keeps an empty HookChain when none is set;
    its launcher skips a hook given as None, so the fast path passes None)."""
    return hook is not None and (not isinstance(hook, HookChain) or bool(hook.calls))


def fast_run(self, *args, grid, warmup, **kwargs):
    """JITFunction.run with the cached fast path (see the module's docstring)."""
    if (warmup or self.pre_run_hooks or self.used_global_vals
            or _hooked(knobs.runtime.launch_enter_hook)
            or _hooked(knobs.runtime.launch_exit_hook) or knobs.runtime.debug
            or self.debug or knobs.compilation.instrumentation_mode not in (None, "", "none")):
        STATS["slow"] += 1
        return _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
    cache = self.__dict__.get("_cake_fast")
    if cache is None:
        cache = self._cake_fast = {}
    try:
        device = current_device()
        params, specialization, options = binder(self, device)(*args, **kwargs)
        key = launch_key(specialization, options, device)
        entry = cache.get(key)
    except TypeError:  # an unhashable constexpr or option, a missing argument: Triton's path
        STATS["slow"] += 1
        return _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
    if entry is not None:
        kernel, run, function, packed, kernel_cache, tkey = entry
        if kernel_cache.get(tkey) is not kernel:  # Triton's cache was cleared: recompile
            entry = None
            del cache[key]
    if entry is None:
        STATS["miss"] += 1
        kernel = _ORIGINAL_RUN(self, *args, grid=grid, warmup=warmup, **kwargs)
        # keep it unless it is an async compile's future, or the dictionary has grown past
        # any real use (a NaN constexpr never equals itself: every call would add a key)
        if kernel is not None and not hasattr(kernel, "result") and len(cache) < _MAX_KEYS:
            kernel_cache, tkey = triton_key(self, device, args, kwargs)
            cache[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata,
                          kernel_cache, tkey)
        return kernel
    if _CHECK:
        now_cache, now_key = triton_key(self, device, args, kwargs)
        if now_cache is not kernel_cache or now_key != tkey:
            raise AssertionError(f"fast_launch: {self.__name__}: the cached kernel is not the "
                                 f"one Triton's cache holds for this call (key {key!r})")
        STATS["checked"] += 1
    if callable(grid):
        grid = grid(params)
    n = len(grid)
    STATS["hit"] += 1
    run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, current_stream(device),
        function, packed, None, None, None, *params.values())
    return kernel


def install(check: bool = False) -> None:
    """Route every JITFunction launch in this process through ``fast_run``."""
    global _CHECK
    _CHECK = check
    JITFunction.run = fast_run


def uninstall() -> None:
    JITFunction.run = _ORIGINAL_RUN
