"""RMSNormSiluGateDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2, sm_count

#: Largest hidden size D (the whole row stays in one tile).
MAX_HIDDEN = 65536
#: Largest padded tile row, ``next_power_of_2(D // G) * next_power_of_2(G)`` elements.
MAX_TILE = 65536


def padded_row(hidden_size: int, group_size: int) -> tuple[int, int]:
    """``(block_ng, block_g)``: the power-of-two tile of one row seen as ``D // G`` groups."""
    return next_power_of_2(hidden_size // group_size), next_power_of_2(group_size)


@dataclasses.dataclass(frozen=True)
class RMSNormSiluGateDetPlan(Plan):
    """Execution plan of the det gated-RMSNorm kernels.

    A row of D elements is held as a ``[block_ng, block_g]`` tile: ``D // G`` groups of
    ``G = group_size`` contiguous elements, each padded to powers of two.

    Fields:
        hidden_size: D, the last dimension.
        group_size: G, the normalized group (G divides D; G = D without groups).
        block_ng / block_g: powers of two >= D // G and >= G.
        block_m_fwd / num_warps_fwd: rows per forward program and its warps.
        block_m_bwd / num_warps_bwd: rows per backward step and its warps.
        bwd_programs: P, the fixed number of backward programs. Program p owns row blocks
            p, p + P, p + 2P, ... in that order and writes one fp32 partial dweight row;
            ``cake_core.gemm.ordered_sum`` adds the P partials in index order. Changing P
            changes the summation order, so dweight bits are promised only for equal plans.
        reduce_block: columns per program of that ordered sum.
        bwd_stages: software-pipelining stages of the backward's loop over a program's row blocks
            (``tl.range(..., num_stages=bwd_stages)``; 1 = no pipelining). The rule: 3 on CUDA for
            rows of at most 1024 padded elements (faster; measurements:
            docs/benchmarks/rmsnorm_silu_gate.md), else 1 (not timed). With 2 or more the next
            block's x, z, dy and rstd loads are issued (cp.async on Hopper) while the current
            block computes: more bytes in flight per SM, the same arithmetic in the same order,
            so the same bits (tested under the interpreter, where the loop is a plain loop, and
            on a GPU by comparison with the plan at 1) (format 2).
    """

    family: ClassVar[str] = "cake-rmsnorm-silu-gate-det-train"
    format_version: ClassVar[int] = 2
    format_upgrades: ClassVar[dict[int, str]] = {
        1: "version 2 added bwd_stages (the backward loop's pipelining stages); add "
           "bwd_stages = 1 and set version = 2 for the same launches and bits"}

    hidden_size: int
    group_size: int
    block_ng: int
    block_g: int
    block_m_fwd: int
    num_warps_fwd: int
    block_m_bwd: int
    num_warps_bwd: int
    bwd_programs: int
    reduce_block: int
    bwd_stages: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_plan_fields(self)
        self.require_mode(Mode.DET)


def check_plan_fields(plan: Plan) -> None:
    """The field checks of :class:`RMSNormSiluGateDetPlan`, on any plan with its fields
    (the nondet sibling's plan runs them too); ``ValueError`` naming ``plan``'s class."""
    plan.require_int_fields()
    plan.require_in_range("hidden_size", 1, MAX_HIDDEN)
    plan.require_in_range("group_size", 1, plan.hidden_size)
    if plan.hidden_size % plan.group_size:
        plan._fail(f"group_size ({plan.group_size}) must divide hidden_size "
                   f"({plan.hidden_size})")
    plan.require_power_of_two("block_ng", "block_g", "block_m_fwd", "block_m_bwd",
                              "reduce_block")
    if plan.block_g < plan.group_size:
        plan._fail("block_g must be >= group_size")
    if plan.block_ng < plan.hidden_size // plan.group_size:
        plan._fail("block_ng must be >= hidden_size // group_size")
    plan.require_at_least("bwd_programs")
    plan.require_in_range("bwd_stages", 1, 4)
    plan.require_warps("num_warps_fwd", "num_warps_bwd")


def _warps(elements: int) -> int:
    return max(1, min(16, elements // 512))


_PLANS: dict[tuple, RMSNormSiluGateDetPlan] = {}


def make_plan(hidden_size: int, dtype: torch.dtype, device: torch.device | str, *,
              group_size: int | None = None) -> RMSNormSiluGateDetPlan:
    """Pick the plan for rows of ``hidden_size`` (D) elements of ``dtype`` on ``device``,
    normalized in groups of ``group_size`` (``None``: the whole row).

    Rules (shapes and device only, no timing at call time): a whole row per
    tile, as ``[next_pow2(D // G), next_pow2(G)]``; forward tiles of about 4096 elements on
    CUDA, backward tiles of about 2048 (it holds more live tensors), 16384 for both under
    the interpreter (each program costs Python time); 1 to 64 rows per tile;
    ``max(1, min(16, tile_elements // 512))`` warps; on CUDA with padded rows of at most
    1024 elements forward tiles of about 2048 elements and twice those warps in both
    kernels (faster for short rows; measurements: docs/benchmarks/rmsnorm_silu_gate.md);
    ``bwd_programs`` = 2 per SM on CUDA
    (1 per SM for padded rows over 4096 elements), 4 on the CPU; ordered-sum blocks of
    ``min(1024, next_pow2(D))`` columns. ``dtype`` is part of the signature for rules to
    come; today's rules read D, G and the device only.

    Raises:
        ValueError: ``hidden_size`` not an int in [1, 65536]; ``group_size`` not an int that
            divides it; a padded row over 65536 elements; a bad ``device``.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) or \
            not 1 <= hidden_size <= MAX_HIDDEN:
        raise ValueError(f"hidden_size: must be an int in [1, {MAX_HIDDEN}], got {hidden_size!r}")
    hidden_size = int(hidden_size)
    group_size = check_group_size(group_size, hidden_size)
    return cached_plan(_PLANS, (hidden_size, group_size, device.type, device.index),
                       lambda: _rule(hidden_size, group_size, device))


def check_group_size(group_size, hidden_size: int) -> int:
    """``group_size`` resolved (``None`` -> D) and checked: an int dividing D whose padded
    row fits :data:`MAX_TILE`. Raises ``ValueError``."""
    if group_size is None:
        group_size = hidden_size
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or \
            not 1 <= group_size <= hidden_size or hidden_size % int(group_size):
        raise ValueError(f"group_size: must be None or an int in [1, D] that divides D="
                         f"{hidden_size}, got {group_size!r}")
    group_size = int(group_size)
    block_ng, block_g = padded_row(hidden_size, group_size)
    if block_ng * block_g > MAX_TILE:
        raise ValueError(
            f"group_size: D={hidden_size} in groups of {group_size} pads to a "
            f"{block_ng}x{block_g} row tile, over {MAX_TILE} elements")
    return group_size


def _rule(hidden_size: int, group_size: int, device: torch.device) -> RMSNormSiluGateDetPlan:
    block_ng, block_g = padded_row(hidden_size, group_size)
    row = block_ng * block_g
    cuda = device.type == "cuda"
    # short rows: forward tiles of 2048 elements and twice the general warps in both kernels
    # (faster at D = 128); rows over 1024 elements keep the general rule (not timed)
    short = cuda and row <= 1024
    block_m_fwd = max(1, min(64, (2048 if short else 4096 if cuda else 16384) // row))
    block_m_bwd = max(1, min(64, (2048 if cuda else 16384) // row))
    warp_scale = 2 if short else 1
    # bwd_stages = 3 for short rows (the pipelined loop: faster, same bits; 2 was slower, 4
    # no better); longer rows not timed: they keep 1
    if cuda:
        bwd_programs = sm_count(device) * (2 if row <= 4096 else 1)
    else:
        bwd_programs = 4
    return RMSNormSiluGateDetPlan(
        hidden_size=hidden_size,
        group_size=group_size,
        block_ng=block_ng,
        block_g=block_g,
        block_m_fwd=block_m_fwd,
        num_warps_fwd=_warps(warp_scale * block_m_fwd * row),
        block_m_bwd=block_m_bwd,
        num_warps_bwd=_warps(warp_scale * block_m_bwd * row),
        bwd_programs=bwd_programs,
        reduce_block=min(1024, next_power_of_2(hidden_size)),
        bwd_stages=3 if short else 1,
    )
