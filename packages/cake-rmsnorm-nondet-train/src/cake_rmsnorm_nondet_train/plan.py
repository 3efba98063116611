"""RMSNormNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_rmsnorm_det_train.plan import check_plan_fields
from cake_rmsnorm_det_train.plan import make_plan as _det_rule


@dataclasses.dataclass(frozen=True)
class RMSNormNondetPlan(Plan):
    """Execution plan of the non-deterministic RMSNorm entries (``mode`` is ``nondet``).

    The fields, their meaning and their checks are cake-rmsnorm-det-train's
    ``RMSNormDetPlan``'s (the same kernels run them today):

    Fields:
        hidden_size: H, the normalized (last) dimension.
        block_h: columns per tile, a power of two >= H (a whole row per tile).
        block_m_fwd / num_warps_fwd: rows per forward program and its warps.
        block_m_bwd / num_warps_bwd: rows per backward step and its warps.
        bwd_programs: P, the number of backward programs, each writing one fp32 partial
            dweight row.
        reduce_block_p / reduce_block_c: partial rows and columns per reduce step.

    Raises:
        ValueError: a field out of range (as ``RMSNormDetPlan``), or ``mode`` not nondet.
    """

    family: ClassVar[str] = "cake-rmsnorm-nondet-train"
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
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_plan_fields(self)
        self.require_mode(Mode.NONDET)


_PLANS: dict[tuple, RMSNormNondetPlan] = {}


def make_nondet_plan(hidden_size: int, dtype: torch.dtype,
                     device: torch.device | str) -> RMSNormNondetPlan:
    """Pick the plan for rows of ``hidden_size`` elements of ``dtype`` on ``device``.

    By rule, as today's rule: cake-rmsnorm-det-train's ``make_plan`` (its kernels run
    this package's calls), its fields in a plan of mode ``nondet``. No timing.

    Raises:
        ValueError: if ``hidden_size`` is outside [1, 65536], or a bad ``device``.
    """
    det = _det_rule(hidden_size, dtype, device)  # checks the arguments
    dev = torch.device(device)
    return cached_plan(_PLANS, (det.hidden_size, dev.type, dev.index), lambda: RMSNormNondetPlan(
        **{f.name: getattr(det, f.name) for f in dataclasses.fields(det) if f.name != "mode"}))
