"""RMSNormDetPlan and the rule that picks it (shapes, dtypes, device; never timing)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_core.triton_utils import next_power_of_2, sm_count

#: Largest hidden size one row-tile holds (the whole row stays in registers).
MAX_HIDDEN = 65536


@dataclasses.dataclass(frozen=True)
class RMSNormDetPlan(Plan):
    """Execution plan of the det RMSNorm kernels.

    Fields:
        hidden_size: H, the normalized (last) dimension.
        block_h: columns per tile, a power of two >= H (a whole row per tile).
        block_m_fwd / num_warps_fwd: rows per forward program and its warps.
        block_m_bwd / num_warps_bwd: rows per backward step and its warps.
        bwd_programs: P, the fixed number of backward programs. Program p owns row blocks
            p, p + P, p + 2P, ... in that order and writes one fp32 partial dweight row;
            the reduce kernel sums the P partials in index order. Changing P changes the
            summation order, so dweight bits are promised only for equal plans.
        reduce_block_p / reduce_block_c: partial rows and columns per reduce step.
    """

    family: ClassVar[str] = "cake-rmsnorm-det-train"
    format_version: ClassVar[int] = 1

    hidden_size: int
    block_h: int
    block_m_fwd: int
    num_warps_fwd: int
    block_m_bwd: int
    num_warps_bwd: int
    bwd_programs: int
    reduce_block_p: int
    reduce_block_c: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_plan_fields(self)
        self.require_mode(Mode.DET)


def check_plan_fields(plan: Plan) -> None:
    """The field checks of :class:`RMSNormDetPlan`, on any plan with its fields (the
    nondet sibling's plan runs them too); ``ValueError`` naming ``plan``'s class."""
    plan.require_int_fields()
    plan.require_in_range("hidden_size", 1, MAX_HIDDEN)
    if plan.block_h < plan.hidden_size:
        plan._fail("block_h must be >= hidden_size")
    plan.require_power_of_two("block_h", "block_m_fwd", "block_m_bwd", "reduce_block_p",
                              "reduce_block_c")
    plan.require_at_least("bwd_programs")
    plan.require_warps("num_warps_fwd", "num_warps_bwd")


def _warps(elements: int) -> int:
    return max(1, min(16, elements // 512))


_PLANS: dict[tuple, RMSNormDetPlan] = {}


def make_plan(hidden_size: int, dtype: torch.dtype, device: torch.device | str) -> RMSNormDetPlan:
    """Pick the plan for rows of ``hidden_size`` elements of ``dtype`` on ``device``.

    Rules (no timing at call time; from a sweep of the tile shapes, measurements:
    docs/benchmarks/rmsnorm.md): a whole row per tile; forward tiles of about 4096
    elements on CUDA (one 2048-wide row per program with 4 warps; 16384 elements under the
    interpreter, where each program costs Python time);
    backward tiles of about 4096 elements with 8 warps (16 for 8192-wide rows), 2 programs
    per SM on CUDA (1 per SM for rows over 4096 elements), 4 on the CPU. ``dtype`` is part
    of the signature for rules to come; today's rules depend on H and the device only.

    Raises:
        ValueError: if ``hidden_size`` is outside [1, 65536].
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {e}") from None
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) or \
            not 1 <= hidden_size <= MAX_HIDDEN:
        raise ValueError(f"hidden_size: must be an int in [1, {MAX_HIDDEN}], got {hidden_size!r}")
    hidden_size = int(hidden_size)
    return cached_plan(_PLANS, (hidden_size, device.type, device.index),
                       lambda: _rule(hidden_size, device))


def _rule(hidden_size: int, device: torch.device) -> RMSNormDetPlan:
    block_h = next_power_of_2(hidden_size)
    cuda = device.type == "cuda"
    tile = 4096 if cuda else 16384
    # 2048-wide rows one per program (4 warps): faster than two per program (8 warps)
    block_m_fwd = 1 if cuda and block_h == 2048 else max(1, min(64, tile // block_h))
    block_m_bwd = max(1, min(64, (4096 if cuda else 16384) // block_h))
    if cuda:
        bwd_programs = sm_count(device) * (2 if block_h <= 4096 else 1)
    else:
        bwd_programs = 4
    reduce_block_c = min(block_h, 128 if cuda else 4096)
    return RMSNormDetPlan(
        hidden_size=hidden_size,
        block_h=block_h,
        block_m_fwd=block_m_fwd,
        num_warps_fwd=_warps(block_m_fwd * block_h),
        block_m_bwd=block_m_bwd,
        num_warps_bwd=(8 if block_m_bwd * block_h <= 4096 or block_h >= 16384 else 16)
        if cuda else _warps(block_m_bwd * block_h),
        bwd_programs=bwd_programs,
        reduce_block_p=min(32, next_power_of_2(bwd_programs)),
        reduce_block_c=reduce_block_c,
    )
