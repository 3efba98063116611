"""Input checks shared by every family, with uniform ``ValueError`` messages.

Each check runs on the host before any allocation or launch and never modifies its
arguments. Messages start with the argument's name: ``"x: expected dtype ..."``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import torch


def check_tensor(t: object, name: str) -> torch.Tensor:
    """Raise ``ValueError`` unless ``t`` is a ``torch.Tensor``; return it."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_dtype(t: torch.Tensor, name: str, allowed: Iterable[torch.dtype]) -> None:
    """Raise ``ValueError`` unless ``t.dtype`` is one of ``allowed``."""
    allowed = tuple(dict.fromkeys(allowed))  # "fp32 or x's dtype" names fp32 once
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name}: expected dtype in ({names}), got {str(t.dtype)[6:]}")


def check_ndim(t: torch.Tensor, name: str, *, min_ndim: int | None = None,
               ndim: int | None = None, layout: str | None = None) -> None:
    """Raise ``ValueError`` unless ``t`` has exactly ``ndim`` or at least ``min_ndim`` dims.

    ``layout`` names the expected layout in the message, after the rank: ``"q: expected 4-D
    tensor ([B, T, H, K], FLA's layout; head-first [B, H, T, K] is not served), got 3-D
    (2, 16, 8)"``."""
    at = f" ({layout})" if layout else ""
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{name}: expected {ndim}-D tensor{at}, got {t.dim()}-D {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(
            f"{name}: expected at least {min_ndim}-D tensor{at}, got {t.dim()}-D "
            f"{tuple(t.shape)}"
        )


def check_shape(t: torch.Tensor, name: str, shape: Sequence[int | None], *,
                layout: str | None = None) -> None:
    """Raise ``ValueError`` unless ``t.shape`` matches ``shape`` (``None`` = any size).

    ``layout`` names the expected layout in the message, after the sizes: ``"k: expected
    shape [2, 16, 4, 8] ([B, T, H, K], FLA's layout; head-first [B, H, T, K] is not
    served), got [2, 4, 16, 8]"``."""
    ok = t.dim() == len(shape) and all(
        s is None or s == d for s, d in zip(shape, t.shape, strict=False))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        at = f" ({layout})" if layout else ""
        raise ValueError(f"{name}: expected shape {want}{at}, got {list(t.shape)}")


def check_same_device(*named: tuple[str, torch.Tensor | None]) -> torch.device:
    """Raise ``ValueError`` unless every given tensor is on the same device; return it."""
    present = [(n, t) for n, t in named if t is not None]
    dev = present[0][1].device
    for n, t in present[1:]:
        if t.device != dev:
            raise ValueError(
                f"{n}: on {t.device}, but {present[0][0]} is on {dev}; all inputs must share "
                "one device"
            )
    return dev


def check_last_dim_contiguous(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` unless the last dimension has stride 1 (or size <= 1)."""
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: last dimension must be contiguous (stride 1), got strides {t.stride()}"
        )


def check_accumulator(t: object, name: str, shape: Sequence[int]) -> None:
    """Validate an fp32 gradient accumulator (Megatron's ``main_grad``): ``None`` passes;
    otherwise a contiguous fp32 tensor of exactly ``shape``, or ``ValueError``."""
    if t is None:
        return
    check_tensor(t, name)
    check_shape(t, name, list(shape))
    check_dtype(t, name, (torch.float32,))
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


def check_flag(value: object, name: str) -> bool:
    """Raise ``ValueError`` unless ``value`` is a real ``bool`` (not ``0``/``1``, not a numpy
    or torch bool); return it."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")
    return value


def check_int(v: object, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """Raise ``ValueError`` unless ``v`` is an integer (not a ``bool``) ``>= minimum`` and, when
    ``maximum`` is given, ``<= maximum``; return it as an ``int``. Messages: ``"name: expected
    an int >= minimum, got v"``, or with a maximum ``"name: must be an int in [minimum,
    maximum], got v"``."""
    integral = not isinstance(v, bool) and isinstance(v, numbers.Integral)
    if maximum is None:
        if not integral or v < minimum:
            raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    elif not integral or not minimum <= v <= maximum:
        raise ValueError(f"{name}: must be an int in [{minimum}, {maximum}], got {v!r}")
    return int(v)


#: The floating dtypes cake's kernels compute in (inputs and outputs).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_float_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    """Raise ``ValueError`` unless ``dtype`` is fp32, bf16 or fp16 (a plan rule's or a
    workspace's dtype argument); return it."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected float32, bfloat16 or float16, got {dtype}")
    return dtype


def check_device(device: object, name: str = "device") -> torch.device:
    """``torch.device(device)``, or ``ValueError`` (``"device: <torch's reason>"``) when
    torch cannot parse it (a plan rule's device argument: a device, a string or an index)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{name}: {e}") from None


def check_alloc_device(device: object, name: str = "device") -> torch.device:
    """:func:`check_device`, and ``ValueError`` for a CUDA device on a machine without CUDA
    (what a workspace's ``for_plan`` checks before it allocates: torch itself raises a
    RuntimeError or an AssertionError there)."""
    dev = check_device(device, name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}: {dev} is a CUDA device, but CUDA is not available here")
    return dev


def check_positive_finite(v: object, name: str) -> float:
    """Raise ``ValueError`` unless ``v`` is a real number > 0 and finite; return it.

    Written as a chained comparison (NaN fails it too), not ``math.isfinite``: under
    ``torch.compile(dynamic=True, fullgraph=True)`` dynamo turns a Python float (even a
    constant default argument) into a traced value, and ``math.isfinite`` of it is a graph
    break that fullgraph refuses."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
        raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
    return float(v)


def check_cu_seqlens(cu_seqlens: object, n_tokens: int, device: torch.device | None = None,
                     *, name: str = "cu_seqlens",
                     read_values: bool = True) -> torch.Tensor | None:
    """Validate packed-sequence offsets; return the values read (int64 CPU ``[N + 1]``), or
    ``None`` with ``read_values=False``.

    ``cu_seqlens`` must be a 1-D int32 or int64 tensor of length ``N + 1`` (N >= 1
    documents) that starts at 0, never decreases and ends at ``n_tokens``. Empty documents
    (equal neighbours) are allowed. This check reads the values, so it syncs a GPU tensor
    once, on the host, before any launch. With ``read_values=False`` only the checks that
    read no values run (type, dtype, rank, length, device): what an entry checks while
    ``torch.compile`` traces (a value read would break the graph); its op then checks the
    values before any launch.

    The values returned are ``cu_seqlens.detach().to("cpu", torch.int64)``: for an int64
    CPU ``cu_seqlens`` that is its own memory (do not modify it).
    :func:`cake_core.varlen.checked_offsets` runs this check once per tensor version.

    Raises:
        ValueError: naming the first rule broken.
    """
    t = check_tensor(cu_seqlens, name)
    check_dtype(t, name, (torch.int32, torch.int64))
    check_ndim(t, name, ndim=1)
    if t.numel() < 2:
        raise ValueError(f"{name}: expected at least 2 entries (one document), got {t.numel()}")
    if device is not None and t.device.type != torch.device(device).type:
        raise ValueError(f"{name}: on {t.device}, inputs on {device}")
    if not read_values:
        return None
    v = t.detach().to("cpu", torch.int64)
    if int(v[0]) != 0:
        raise ValueError(f"{name}: must start at 0, got {int(v[0])}")
    d = v[1:] - v[:-1]
    if bool((d < 0).any()):
        i = int(torch.nonzero(d < 0)[0])
        raise ValueError(
            f"{name}: must be non-decreasing, but entry {i + 1} ({int(v[i + 1])}) < "
            f"entry {i} ({int(v[i])})"
        )
    if int(v[-1]) != n_tokens:
        raise ValueError(f"{name}: must end at the token count {n_tokens}, got {int(v[-1])}")
    return v
