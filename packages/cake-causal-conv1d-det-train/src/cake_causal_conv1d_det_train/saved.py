"""CausalConv1dDetSavedSet and CausalConv1dDetWorkspace (modes checked through cake_core)."""

from __future__ import annotations

import numbers
from typing import ClassVar

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_causal_conv1d_det_train.plan import CausalConv1dDetPlan


class CausalConv1dDetSavedSet(SavedSet):
    """What the det forward keeps for the backward. The pre-activation is not kept: the
    backward recomputes it from x and the state, tap by tap in the forward's order, so no
    [B, T, D] tensor lives from forward to backward.

    Tensors:
        x: ``[B, T, D]`` as given (any batch/time strides, channels contiguous).
        weight: ``[D, W]``. bias: ``[D]`` or ``None``.
        initial_state: ``[N, D, W - 1]`` or ``None``.
        cu_seqlens: ``[N + 1]`` int32/int64 as given, or ``None`` (fixed length).
    Meta: ``activation`` (``None`` or ``"silu"``), ``plan`` (the forward's
    CausalConv1dDetPlan), ``offsets`` (CPU int64 ``[N + 1]`` sequence offsets, so the
    backward reads no device values), ``n_seqs`` (N).
    """

    tensor_names = ("x", "weight", "bias", "initial_state", "cu_seqlens")
    format_version = 1


def max_blocks(num_tokens: int, num_seqs: int, block_t: int) -> int:
    """A bound on the ``block_t``-token blocks of ``num_seqs`` sequences of ``num_tokens``
    tokens in all: each sequence is cut into its own ``max(1, cdiv(L, block_t))`` blocks
    (an empty sequence has one, of masked rows), so at most
    ``num_tokens // block_t + num_seqs``."""
    return num_tokens // block_t + num_seqs


def da_once_programs(device: torch.device | str) -> int:
    """Programs of the persistent ``bwd_da_once`` backward (one fp32 scratch slot each):
    8 per SM on CUDA; 3 elsewhere (the interpreter: few programs, several tiles each). The
    count changes no bit (the tiles are independent)."""
    device = torch.device(device)
    if device.type == "cuda":
        return 8 * torch.cuda.get_device_properties(device).multi_processor_count
    return 3


def da_scratch_shape(plan: CausalConv1dDetPlan, programs: int) -> tuple[int, int, int]:
    """``[programs, block_t_bwd + BW, block_d_bwd]`` (BW = W rounded up to a power of two):
    each program's dpre rows, its tile's and the W - 1 halo rows after it."""
    bw = 1 << (plan.kernel_size - 1).bit_length()
    return (programs, plan.block_t_bwd + bw, plan.block_d_bwd)


def _count(v: object, name: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return int(v)


class CausalConv1dDetWorkspace(Workspace):
    """fp32 partial sums of the backward for one plan, sized for a token and sequence
    capacity.

    Buffers (``P = max_blocks(max_tokens, max_seqs, plan.block_t_bwd)``):
    ``dweight_partials`` ``[P, D, W]`` and ``dbias_partials`` ``[P, D]``, one row per block
    of ``plan.block_t_bwd`` tokens of a sequence; with ``plan.bwd_da_once`` also
    ``da_scratch`` :func:`da_scratch_shape` ``(plan, da_once_programs(device))``, fp32, the
    persistent backward's per-program dpre rows (its leading dim is the launch's program
    count). A call uses the leading rows; contents are overwritten each backward (no state
    carries over). Build with :meth:`for_plan`.
    """

    #: the plan class (and through it the mode) :meth:`for_plan` takes
    plan_class: ClassVar[type[CausalConv1dDetPlan]] = CausalConv1dDetPlan

    @classmethod
    def for_plan(cls, plan: CausalConv1dDetPlan, device: torch.device | str, *,
                 max_tokens: int, max_seqs: int = 1) -> CausalConv1dDetWorkspace:
        """Allocate the buffers for backwards of ``plan`` over at most ``max_tokens`` tokens
        (B * T) in at most ``max_seqs`` sequences (B, or the documents of ``cu_seqlens``).

        Raises:
            ValueError: a plan of another type, ``max_tokens`` not an int >= 0,
                ``max_seqs`` not an int >= 1.
        """
        device = check_alloc_device(device)
        specs = cls._buffer_specs(plan, device, max_tokens, max_seqs)
        ws = cls(plan, device, {name: torch.empty(shape, dtype=dtype, device=device)
                                for name, (shape, dtype) in specs.items()})
        ws.max_blocks = specs["dweight_partials"][0][0]
        return ws

    @classmethod
    def _buffer_specs(cls, plan: CausalConv1dDetPlan, device: torch.device, max_tokens: int,
                      max_seqs: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{name: (shape, dtype)}`` of what :meth:`for_plan` allocates (what
        ``workspace_bytes`` sums), after :meth:`for_plan`'s argument checks."""
        want = cls.plan_class
        if not isinstance(plan, want):
            raise ValueError(f"plan: expected {want.__name__}, got {type(plan).__name__}")
        if plan.mode != want.expected_mode:  # a sibling mode's plan (a subclass)
            raise ValueError(f"plan: got {type(plan).__name__} with mode={plan.mode}, "
                             f"expected {want.__name__} with mode={want.expected_mode}")
        cap = _count(max_tokens, "max_tokens", 0)
        seqs = _count(max_seqs, "max_seqs", 1)
        P = max_blocks(cap, seqs, plan.block_t_bwd)
        D, W = plan.hidden_size, plan.kernel_size
        f32 = torch.float32
        specs = {"dweight_partials": ((P, D, W), f32), "dbias_partials": ((P, D), f32)}
        if plan.bwd_da_once:
            specs["da_scratch"] = (da_scratch_shape(plan, da_once_programs(device)), f32)
        return specs


__all__ = ["CausalConv1dDetSavedSet", "CausalConv1dDetWorkspace", "Mode", "da_once_programs",
           "da_scratch_shape", "max_blocks"]
