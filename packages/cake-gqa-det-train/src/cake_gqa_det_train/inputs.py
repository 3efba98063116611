"""Input checks of the GQA entries (shared with the non-deterministic sibling
``cake_gqa_train``): every rule a call must meet, checked on the host before any
allocation or launch, as ``ValueError``; the caller's tensors are never modified."""

from __future__ import annotations

import dataclasses
import numbers

import torch
from cake_core import (
    check_dtype,
    check_flag,
    check_last_dim_contiguous,
    check_same_device,
    check_tensor,
)
from cake_core.checks import check_cu_seqlens
from cake_core.triton_utils import launch_device_check
from cake_core.varlen import checked_offsets

from cake_gqa_det_train.plan import HEAD_DIMS

#: Most documents (grid axis 2 on CUDA) and query heads (axis 1) one call serves.
MAX_DOCS = 65535
MAX_HEADS = 65535


@dataclasses.dataclass(frozen=True)
class Problem:
    """One call's sizes and options, after the checks.

    ``varlen``: packed input with offsets; else a batch of ``n_docs`` rows of ``seq_q`` /
    ``seq_k`` tokens. ``max_q`` / ``max_k``: the longest document (-1: not read yet, under
    ``torch.compile``; the op reads them). ``left`` / ``right``: the window with causal
    folded in (-1 = unbounded)."""

    varlen: bool
    n_docs: int
    seq_q: int
    seq_k: int
    n_tok_q: int
    n_tok_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    max_q: int
    max_k: int
    scale: float
    softcap: float
    left: int
    right: int

    def op_ints(self) -> list[int]:
        """What crosses a custom op: (seq_q, seq_k, n_docs, max_q, max_k, left, right)."""
        return [self.seq_q, self.seq_k, self.n_docs, self.max_q, self.max_k, self.left,
                self.right]


#: Input dtypes (fp32 runs its dots in TF32 on CUDA, as torch's default for convolutions).
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _window(window_size, causal: bool) -> tuple[int, int]:
    ok = (isinstance(window_size, (tuple, list)) and len(window_size) == 2
          and all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1
                  for w in window_size))
    if not ok:
        raise ValueError("window_size: expected a pair of ints >= -1 (left, right; -1 = "
                         f"unbounded), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    return left, 0 if causal else right


def unbounded_window(left: int, right: int, len_q: int, len_k: int) -> tuple[int, int]:
    """The window with any side that reaches past every document made unbounded (-1), as
    flash-attn does: row m sees key n when ``m + shift - left <= n <= m + shift + right``
    (``shift = len_k - len_q`` of its document), so ``right >= len_q`` or ``left >= len_k``
    (the longest documents, or bounds above them) hides no key. Keeps the kernels' index
    arithmetic far from int32 overflow for windows up to ``2**63``."""
    return (-1 if left >= len_k else left), (-1 if right > 0 and right >= len_q else right)


def check_options(softmax_scale, causal, window_size, softcap, head_dim: int):
    """(scale, softcap, left, right)."""
    check_flag(causal, "causal")
    if softmax_scale is None:
        scale = head_dim ** -0.5
    else:
        if (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real)
                or not 0 < softmax_scale < float("inf")):
            raise ValueError(f"softmax_scale: expected a finite number > 0 or None, got "
                             f"{softmax_scale!r}")
        scale = float(softmax_scale)
    if (isinstance(softcap, bool) or not isinstance(softcap, numbers.Real)
            or not 0 <= softcap < float("inf")):
        raise ValueError(f"softcap: expected a finite number >= 0 (0 = off), got {softcap!r}")
    left, right = _window(window_size, causal)
    return scale, float(softcap), left, right


def _max_len(offsets: torch.Tensor) -> int:
    return int((offsets[1:] - offsets[:-1]).max()) if offsets.numel() > 1 else 0


def _max_arg(v, name: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"{name}: expected an int >= 0 or None, got {v!r}")
    return int(v)


def check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               softmax_scale, causal, window_size, softcap, *,
               meta_ok: bool = False) -> tuple[Problem, torch.device]:
    """All the checks of one call; returns the :class:`Problem` and the device.

    Fixed length: q ``[B, Sq, Hq, D]``, k / v ``[B, Sk, Hkv, D]``, no offsets. Packed:
    q ``[Tq, Hq, D]``, k / v ``[Tk, Hkv, D]``, ``cu_seqlens_q`` required,
    ``cu_seqlens_k`` defaulting to it. Values of the offsets are read (one host sync per
    tensor version, cached) except while ``torch.compile`` traces. ``meta_ok`` (the size
    queries): inputs on the meta device pass the device check and their offsets' values
    are not read (meta tensors have none); the Problem's max lengths are then -1."""
    for n, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, n)
    device = check_same_device(("q", q), ("k", k), ("v", v))
    if not (meta_ok and device.type == "meta"):
        launch_device_check(device, "q")
    if q.dim() not in (3, 4):
        raise ValueError(f"q: expected [B, S, H, D] or packed [T, H, D], got {q.dim()}-D "
                         f"{list(q.shape)}")
    for n, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{n}: expected {q.dim()}-D like q, got {t.dim()}-D "
                             f"{list(t.shape)}")
    check_dtype(q, "q", DTYPES)
    check_dtype(k, "k", (q.dtype,))
    check_dtype(v, "v", (q.dtype,))
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        raise ValueError(f"q: head dim {D} is not served; one of {HEAD_DIMS}")
    if k.shape[-1] != D or v.shape[-1] != D:
        raise ValueError(f"k, v: head dims must equal q's ({D}), got k {k.shape[-1]}, "
                         f"v {v.shape[-1]}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"v: expected k's shape {list(k.shape)}, got {list(v.shape)}")
    Hq, Hkv = q.shape[-2], k.shape[-2]
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(f"q, k: query heads ({Hq}) must be a positive multiple of KV heads "
                         f"({Hkv})")
    if Hq > MAX_HEADS:
        raise ValueError(f"q: at most {MAX_HEADS} heads, got {Hq}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        check_last_dim_contiguous(t, n)
    scale, cap, left, right = check_options(softmax_scale, causal, window_size, softcap, D)
    max_q = _max_arg(max_seqlen_q, "max_seqlen_q")
    max_k = _max_arg(max_seqlen_k, "max_seqlen_k")
    if q.dim() == 4:
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_q / cu_seqlens_k: only for packed [T, H, D] input; "
                             "q is [B, S, H, D]")
        B, Sq, Sk = q.shape[0], q.shape[1], k.shape[1]
        for n, given, got in (("max_seqlen_q", max_q, Sq), ("max_seqlen_k", max_k, Sk)):
            if given is not None and given < got:
                raise ValueError(f"{n}: {given} is below the sequence length ({got})")
        if k.shape[0] != B:
            raise ValueError(f"k: batch {k.shape[0]} differs from q's {B}")
        if B > MAX_DOCS:
            raise ValueError(f"q: at most {MAX_DOCS} batch rows, got {B}")
        left, right = unbounded_window(left, right, Sq, Sk)
        return Problem(False, B, Sq, Sk, B * Sq, B * Sk, Hq, Hkv, D, Sq, Sk, scale, cap,
                       left, right), device
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q: packed [T, H, D] input needs offsets "
                         "(for a batch, pass q as [B, S, H, D])")
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    Tq, Tk = q.shape[0], k.shape[0]
    left, right = unbounded_window(left, right, Tq, Tk)  # no document is longer than T
    for n, t, T in (("cu_seqlens_q", cu_seqlens_q, Tq), ("cu_seqlens_k", cu_seqlens_k, Tk)):
        check_cu_seqlens(t, T, device, name=n, read_values=False)
    n_docs = cu_seqlens_q.numel() - 1
    if cu_seqlens_k.numel() - 1 != n_docs:
        raise ValueError(f"cu_seqlens_k: {cu_seqlens_k.numel() - 1} documents, cu_seqlens_q "
                         f"has {n_docs}")
    if n_docs > MAX_DOCS:
        raise ValueError(f"cu_seqlens_q: at most {MAX_DOCS} documents, got {n_docs}")
    # the op reads and checks the values (meta inputs, only the size queries', have none)
    if torch.compiler.is_compiling() or device.type == "meta":
        return Problem(True, n_docs, -1, -1, Tq, Tk, Hq, Hkv, D,
                       -1 if max_q is None else max_q, -1 if max_k is None else max_k,
                       scale, cap, left, right), device
    got_q, got_k = read_max_lengths(cu_seqlens_q, cu_seqlens_k, Tq, Tk, device)
    for n, given, got in (("max_seqlen_q", max_q, got_q), ("max_seqlen_k", max_k, got_k)):
        if given is not None and given < got:
            raise ValueError(f"{n}: {given} is below the longest document ({got})")
    return Problem(True, n_docs, -1, -1, Tq, Tk, Hq, Hkv, D,
                   got_q if max_q is None else max_q, got_k if max_k is None else max_k,
                   scale, cap, left, right), device


def read_max_lengths(cu_q: torch.Tensor, cu_k: torch.Tensor, Tq: int, Tk: int,
                     device) -> tuple[int, int]:
    """Validate both offsets' values (cached per tensor version) and return the longest
    document of each."""
    oq = checked_offsets(cu_q, Tq, device, name="cu_seqlens_q")
    ok = checked_offsets(cu_k, Tk, device, name="cu_seqlens_k")
    return _max_len(oq), _max_len(ok)


def resolve_op_ints(ints, q: torch.Tensor, k: torch.Tensor, cu_q, cu_k) -> list[int]:
    """Inside an op, before any launch: a packed call's offsets checked again (a cache hit
    after the entry's check in eager mode; the only check of their values under
    ``torch.compile``), max lengths read where they are -1 and refused where below the
    longest document. Returns the ints with the max lengths resolved.

    Raises:
        ValueError: as :func:`check_call`.
    """
    ints = list(ints)
    if ints[0] >= 0:  # fixed length
        return ints
    got_q, got_k = read_max_lengths(cu_q, cu_q if cu_k is None else cu_k, q.shape[0],
                                    k.shape[0], q.device)
    for i, n, got in ((3, "max_seqlen_q", got_q), (4, "max_seqlen_k", got_k)):
        if ints[i] < 0:
            ints[i] = got
        elif ints[i] < got:
            raise ValueError(f"{n}: {ints[i]} is below the longest document ({got})")
    return ints
