"""GDNNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_gdn_det_train.plan import GDNDetPlan, plan_by_rule


@dataclasses.dataclass(frozen=True)
class GDNNondetPlan(GDNDetPlan):
    """Execution plan of cake-gdn-nondet-train (``mode`` is ``nondet``).

    The fields, their checks and their meaning are :class:`cake_gdn_det_train.GDNDetPlan`'s
    (this package launches cake-gdn-det-train's kernels with them); only the mode and the
    class differ, so a det entry refuses this plan and this package refuses a det one
    (``ValueError``). Serialises with ``to_dict`` / ``from_dict`` as any cake plan.
    """

    family: ClassVar[str] = "cake-gdn-nondet-train"
    format_version: ClassVar[int] = 1
    expected_mode: ClassVar[Mode] = Mode.NONDET
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, GDNNondetPlan] = {}


def make_nondet_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
                     device: torch.device | str, *,
                     state_programs: int | None = None) -> GDNNondetPlan:
    """The plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``: by
    cake-gdn-det-train's rule (``cake_gdn_det_train.make_plan``: shapes, dtype and device
    only, no timing; ``state_programs`` as there), as a :class:`GDNNondetPlan`. Today the
    plan is chosen by that rule; nothing here is timed.

    Raises:
        ValueError: as ``cake_gdn_det_train.make_plan`` (K or V outside [1, 256], a dtype
            other than fp32/bf16/fp16, the CUDA limits, a bad ``state_programs``).
    """
    return plan_by_rule(GDNNondetPlan, _PLANS, head_k_dim, head_v_dim, dtype, device,
                        state_programs)
