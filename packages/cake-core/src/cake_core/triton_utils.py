"""Triton helpers: the CUDA-or-interpreter rule, interpreter detection, a safe ``dot``.

The rule (:func:`select_backend`), applied once before any family defines kernels:
a CUDA device present -> kernels compile for the GPU; no CUDA device and
``TRITON_INTERPRET`` unset -> cake sets ``TRITON_INTERPRET=1`` so kernels run on the CPU
through Triton's interpreter. Setting ``TRITON_INTERPRET`` yourself always wins. Under the
interpreter, importing this module raises ``ImportError`` naming ``cake-core[interpreter]``
when numpy is missing or incompatible with the installed Triton
(:func:`cake_core.backend.require_interpreter_numpy`). At call time
:func:`launch_device_check` refuses tensors the chosen backend cannot run on.
"""

from __future__ import annotations

import torch

from cake_core.backend import (  # noqa: E402  (re-exported)
    require_interpreter_numpy,
    select_backend,
)


def is_interpreting() -> bool:
    """True when Triton kernels run through the interpreter (``TRITON_INTERPRET=1``)."""
    return select_backend() == "interpreter"


def launch_device_check(device: torch.device, name: str = "inputs") -> None:
    """Raise ``ValueError`` unless kernels can run on ``device`` under the chosen backend."""
    backend = select_backend()
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(
            f"{name}: on {device}, but Triton compiles for CUDA in this process; move the "
            "tensors to a CUDA device, or set TRITON_INTERPRET=1 before importing cake "
            "families to run on the CPU"
        )
    if backend == "interpreter" and device.type != "cpu":
        raise ValueError(
            f"{name}: on {device}, but TRITON_INTERPRET=1 runs kernels on the CPU; use CPU "
            "tensors or unset TRITON_INTERPRET"
        )


def _cuda_properties(device: torch.device):
    """``torch.cuda.get_device_properties(device)``, or ``ValueError`` where this machine
    has no CUDA (torch itself raises an AssertionError or RuntimeError there)."""
    if not torch.cuda.is_available():
        raise ValueError(f"device: {device} is a CUDA device, but CUDA is not available here "
                         "(a CUDA plan reads the device's SM count and compute capability)")
    return torch.cuda.get_device_properties(device)


def sm_count(device: torch.device) -> int:
    """Number of streaming multiprocessors (a fixed 4 under the interpreter or on CPU).

    Raises:
        ValueError: ``device`` is a CUDA device and this machine has no CUDA.
    """
    if device.type == "cuda":
        return _cuda_properties(device).multi_processor_count
    return 4


#: Opt-in shared memory per block (bytes) of the GPU classes plan rules size tiles for:
#: Hopper and datacenter Blackwell; A100; consumer Ampere, Ada and Blackwell.
HOPPER_SHARED_MEMORY, A100_SHARED_MEMORY, SMALL_SHARED_MEMORY = 232448, 166912, 101376

#: Shared memory one program may use on the interpreter (no such limit on the CPU; the
#: figure of Hopper / datacenter Blackwell, so a CPU rule sees no reason to shrink tiles).
CPU_SHARED_MEMORY = HOPPER_SHARED_MEMORY


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program (thread block) may use on ``device``: CUDA's
    opt-in per-block limit (227 KiB on Hopper and datacenter Blackwell, 163 KiB on A100,
    99 KiB on consumer Ampere, Ada and Blackwell; 99 KiB where torch does not report it),
    ``CPU_SHARED_MEMORY`` under the interpreter or on the CPU. A rule input: a plan whose
    tiles and stages need more fails to launch ("out of resource: shared memory").

    Raises:
        ValueError: ``device`` is a CUDA device and this machine has no CUDA.
    """
    if device.type == "cuda":
        props = _cuda_properties(device)
        return int(getattr(props, "shared_memory_per_block_optin", 0) or SMALL_SHARED_MEMORY)
    return CPU_SHARED_MEMORY


def rule_shared_memory(device: torch.device) -> int:
    """The shared memory per block a plan rule sizes tiles for: the CUDA device's opt-in
    limit (:func:`max_shared_memory`); Hopper's where there is no CUDA (a CUDA plan made on
    a machine without a GPU) and on the CPU."""
    if device.type == "cuda" and torch.cuda.is_available():
        return max_shared_memory(device)
    return CPU_SHARED_MEMORY


def device_signature(device: torch.device) -> str:
    """A short string naming the hardware (for plan rules and benchmark records).

    Raises:
        ValueError: ``device`` is a CUDA device and this machine has no CUDA.
    """
    if device.type == "cuda":
        p = _cuda_properties(device)
        return f"{p.name}|sm_{p.major}{p.minor}|{p.multi_processor_count}"
    return "cpu-interpreter"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0`` (a launch grid's program count, on the host)."""
    return -(-a // b)


select_backend()
# under the interpreter, a missing or incompatible numpy: one ImportError naming the extra
require_interpreter_numpy()

import triton  # noqa: E402  (after the backend rule sets TRITON_INTERPRET)
import triton.language as tl  # noqa: E402

INTERPRETING: tl.constexpr = tl.constexpr(is_interpreting())


@triton.jit
def dot(a, b, acc):
    """``acc + a @ b`` in fp32. Under the interpreter, operands are upcast to fp32 first
    (the interpreter's bf16 ``tl.dot`` returns garbage in triton 3.6); compiled code keeps
    the operands' dtype so tensor cores run at full rate.

    Pass ``acc`` as a variable: Triton 3.6's interpreter fails on a nested ``@triton.jit``
    call inside the argument list (``dot(a, b, tl.zeros(...))``)."""
    if INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tanh(x):
    """fp32 tanh without libdevice (the interpreter runs it too): ``2 sigmoid(2x) - 1``
    (exact limits at +-inf), and near 0, where that form cancels (an absolute error of
    ~1e-7, so a soft cap ``c tanh(s / c)`` drifts by ~c * 1e-7 at large c), the odd Taylor
    series, whose next term is under 1e-9 of x at |x| < 0.1."""
    x2 = x * x
    small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    return tl.where(tl.abs(x) < 0.1, small, 2.0 * tl.sigmoid(2.0 * x) - 1.0)


def _torch_scratch(size: int, alignment: int, stream):
    # torch's caching allocator, on the current CUDA device (the one Triton launches on)
    return torch.empty(size, dtype=torch.int8,
                       device="cuda" if select_backend() == "cuda" else "cpu")


def ensure_scratch_allocator() -> None:
    """Give Triton an allocator for kernels' global scratch (device-side TMA descriptors,
    ``tl.make_tensor_descriptor``) unless one is set: torch's caching allocator. Triton
    keeps the allocator per thread (a ContextVar) and autograd runs backwards in threads of
    its own, so a launch that needs scratch calls this first, each time (cheap). An
    allocator the caller set is left as it is."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


def default_device() -> torch.device:
    """``cuda`` when kernels compile for CUDA in this process, else ``cpu``."""
    return torch.device("cuda" if select_backend() == "cuda" else "cpu")
