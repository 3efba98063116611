"""MoEGroupedNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_core.plan import cached_plan
from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan
from cake_moe_grouped_det_gemm.plan import make_plan as det_make_plan


@dataclasses.dataclass(frozen=True)
class MoEGroupedNondetPlan(MoEGroupedDetPlan):
    """Execution plan of the nondet MoE grouped GEMM (``mode`` is ``nondet``).

    The fields, their meaning and their checks are cake-moe-grouped-det-gemm's
    ``MoEGroupedDetPlan`` (E, N, K, tiles, ``wgrad_splits``, ``tma``,
    ``grouped_mm_fwd_dgrad``, ``wgrad_order``, ...): this package runs that package's
    kernels with them. A det entry refuses this plan and this package refuses the det one
    (``ValueError``). ``to_dict()`` / ``from_dict()`` as every cake plan (format version 1).
    """

    family: ClassVar[str] = "cake-moe-grouped-nondet-gemm"
    format_version: ClassVar[int] = 1
    format_upgrades: ClassVar[dict[int, str]] = {}
    expected_mode: ClassVar[Mode] = Mode.NONDET
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, MoEGroupedNondetPlan] = {}


def make_nondet_plan(M: int, E: int, N: int, K: int, dtype: torch.dtype,
                     device: torch.device | str) -> MoEGroupedNondetPlan:
    """The plan for ``M`` tokens over ``E`` experts of weight ``[E, N, K]`` in ``dtype`` on
    ``device``.

    By rule today, never by timing: the fields of
    ``cake_moe_grouped_det_gemm.make_plan(M, E, N, K, dtype, device)`` (read its docstring
    for the rule), in a plan of mode ``nondet``. Equal arguments give the equal plan.

    Raises:
        ValueError: as the det rule.
    """
    det = det_make_plan(M, E, N, K, dtype, device)
    return cached_plan(_PLANS, (det,), lambda: from_det_plan(det))


def from_det_plan(det: MoEGroupedDetPlan) -> MoEGroupedNondetPlan:
    """The nondet plan with every field of ``det`` (the same launches)."""
    return MoEGroupedNondetPlan(**{f.name: getattr(det, f.name)
                                   for f in dataclasses.fields(det) if f.name != "mode"})
