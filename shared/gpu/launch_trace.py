"""Find the first Triton launch whose results differ between two identical calls.

    from launch_trace import trace
    with trace("cake_kda_det_train") as log:   # the kernels the package's modules launch
        fn()                                   # one call
    ... second call into another log, then ``first_difference(log_a, log_b)``

Each launch of a wrapped kernel records, per tensor argument, the sha256 of its bytes before
and after the launch (the device is synchronised by the copy). Comparing two calls' records
in launch order names the first kernel whose outputs differ although every tensor it got had
the same bits (a fault of that kernel), or whose inputs already differed (a fault earlier,
outside the traced kernels: torch ops, or scratch read before written). Slow (every tensor
argument is hashed twice per launch): a diagnosis tool, not for timing.
"""
from __future__ import annotations

import contextlib
import hashlib
import sys

import torch
from triton.runtime.jit import JITFunction

try:  # Triton's interpreter wraps kernels in another class (a CPU smoke run)
    from triton.runtime.interpreter import InterpretedFunction
    _KERNELS: tuple = (JITFunction, InterpretedFunction)
except ImportError:  # pragma: no cover - older or newer Triton
    _KERNELS = (JITFunction,)


def _sha(t: torch.Tensor) -> str:
    b = t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(b).hexdigest()[:12]


class _Traced:
    def __init__(self, name: str, fn, log: list):
        self.name, self.fn, self.log = name, fn, log

    def __getitem__(self, grid):
        launch = self.fn[grid]

        def run(*args, **kw):
            before = [_sha(a) if isinstance(a, torch.Tensor) else None for a in args]
            out = launch(*args, **kw)
            after = [_sha(a) if isinstance(a, torch.Tensor) else None for a in args]
            names = list(getattr(self.fn, "arg_names", None) or range(len(args)))
            self.log.append((self.name, before, after, names))
            return out
        return run


#: cake-core's chunk engine (GDN, KDA): modules holding kernels and their launch helpers
ENGINE = ("cake_core.chunk_state", "cake_core.chunk_output")


@contextlib.contextmanager
def trace(package: str):
    """Wrap every launched kernel (a ``@triton.jit`` global named ``*_kernel``) of the loaded
    modules of ``package`` outside its ``kernels`` subpackage (where the launches are), and
    of cake-core's chunk engine (:data:`ENGINE`, launched by GDN and KDA).

    Meanwhile torch fills every new ``torch.empty`` tensor (NaN for floats, the largest
    value for ints: ``torch.utils.deterministic.fill_uninitialized_memory`` under
    ``torch.use_deterministic_algorithms(True, warn_only=True)``, both restored after): a
    buffer that one launch fills only in part and a later launch completes (KDA's pair
    products, by its sub-chunk and token-parallel kernels) then hashes the same in two calls, and a read of
    never-written memory shows as NaN."""
    det = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    log: list = []
    saved = []
    for mname, mod in list(sys.modules.items()):
        if mod is None or not (mname == package or mname.startswith(package + ".")
                               or mname in ENGINE):
            continue
        if ".kernels" in mname:  # kernels' own globals: helpers the compiler resolves
            continue
        for attr, val in list(vars(mod).items()):
            if isinstance(val, _KERNELS) and attr.endswith("_kernel"):
                saved.append((mod, attr, val))
                setattr(mod, attr, _Traced(attr, val, log))
    try:
        yield log
    finally:
        for mod, attr, val in saved:
            setattr(mod, attr, val)
        torch.use_deterministic_algorithms(det[0], warn_only=det[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill


def first_difference(a: list, b: list) -> str:
    """The first launch (in order) that wrote different bits in logs a and b, with the
    tensors it did not write that differ between the calls (none: the fault is this
    kernel's; inputs: look earlier; untouched scratch: harmless unless the kernel reads it)."""
    if [x[0] for x in a] != [x[0] for x in b]:
        return "the two calls launched different kernel sequences"
    for i, ((name, ba, aa, names), (_, bb, ab, _)) in enumerate(zip(a, b, strict=True)):
        nm = [names[j] if j < len(names) else j for j in range(len(ba))]
        written = [j for j in range(len(ba)) if aa[j] != ba[j] or ab[j] != bb[j]]
        diff = [nm[j] for j in written if aa[j] != ab[j]]
        if diff:
            read = [nm[j] for j in range(len(ba))
                    if j not in written and ba[j] is not None and ba[j] != bb[j]]
            return (f"launch {i} ({name}): written {diff} differ; tensors it did not write "
                    f"that differ (inputs, or untouched scratch): {read or 'none'}")
    return "no difference"
