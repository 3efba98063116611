"""RMSNormSiluGateNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode, Plan
from cake_core.plan import cached_plan
from cake_rmsnorm_silu_gate_det_train.plan import check_plan_fields
from cake_rmsnorm_silu_gate_det_train.plan import make_plan as _det_rule


@dataclasses.dataclass(frozen=True)
class RMSNormSiluGateNondetPlan(Plan):
    """Execution plan of the non-deterministic gated-RMSNorm entries (``mode`` is
    ``nondet``).

    The fields, their meaning and their checks are cake-rmsnorm-silu-gate-det-train's
    ``RMSNormSiluGateDetPlan``'s (the same kernels run them today). A row of D elements
    is held as a ``[block_ng, block_g]`` tile: ``D // G`` groups of ``G`` elements.

    Fields:
        hidden_size: D, the last dimension.
        group_size: G, the normalized group (G divides D; G = D without groups).
        block_ng / block_g: powers of two >= D // G and >= G.
        block_m_fwd / num_warps_fwd: rows per forward program and its warps.
        block_m_bwd / num_warps_bwd: rows per backward step and its warps.
        bwd_programs: P, the number of backward programs, each writing one fp32 partial
            dweight row.
        reduce_block: columns per program of the sum of the P partials.
        bwd_stages: software-pipelining stages of the backward's loop (1 to 4).

    Raises:
        ValueError: a field out of range (as ``RMSNormSiluGateDetPlan``), or ``mode`` not
            nondet.
    """

    family: ClassVar[str] = "cake-rmsnorm-silu-gate-nondet-train"
    format_version: ClassVar[int] = 1

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
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_plan_fields(self)
        self.require_mode(Mode.NONDET)


_PLANS: dict[tuple, RMSNormSiluGateNondetPlan] = {}


def make_nondet_plan(hidden_size: int, dtype: torch.dtype, device: torch.device | str, *,
                     group_size: int | None = None) -> RMSNormSiluGateNondetPlan:
    """Pick the plan for rows of ``hidden_size`` (D) elements of ``dtype`` on ``device``,
    normalized in groups of ``group_size`` (``None``: the whole row).

    By rule, as today's rule: cake-rmsnorm-silu-gate-det-train's ``make_plan`` (its
    kernels run this package's calls), its fields in a plan of mode ``nondet``. No timing.

    Raises:
        ValueError: as that ``make_plan``: ``hidden_size`` not an int in [1, 65536];
            ``group_size`` not an int that divides it; a padded row over 65536 elements; a
            bad ``device``.
    """
    det = _det_rule(hidden_size, dtype, device, group_size=group_size)  # checks arguments
    dev = torch.device(device)
    return cached_plan(
        _PLANS, (det.hidden_size, det.group_size, dev.type, dev.index),
        lambda: RMSNormSiluGateNondetPlan(**{f.name: getattr(det, f.name)
                                             for f in dataclasses.fields(det)
                                             if f.name != "mode"}))
