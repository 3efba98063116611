"""MHCNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_core.plan import cached_plan
from cake_mhc_det_train.plan import MHCDetPlan
from cake_mhc_det_train.plan import make_plan as det_make_plan


@dataclasses.dataclass(frozen=True)
class MHCNondetPlan(MHCDetPlan):
    """Execution plan of the nondet mHC kernels (``mode`` is ``nondet``).

    The fields, their meaning and their checks are cake-mhc-det-train's ``MHCDetPlan``
    (n_streams, hidden_size, the tiles of each kernel, ``dphi_slices``, ``fp32_dots``;
    dtype-agnostic): this package runs that package's kernels with them. A det entry
    refuses this plan and this package refuses the det one (``ValueError``).
    ``to_dict()`` / ``from_dict()`` as every cake plan (format version 1).
    """

    family: ClassVar[str] = "cake-mhc-nondet-train"
    format_version: ClassVar[int] = 1
    format_upgrades: ClassVar[dict[int, str]] = {}
    expected_mode: ClassVar[Mode] = Mode.NONDET
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, MHCNondetPlan] = {}


def make_nondet_plan(n_streams: int, hidden_size: int, dtype: torch.dtype,
                     device: torch.device | str) -> MHCNondetPlan:
    """The plan for tokens of ``n_streams`` streams of width ``hidden_size``.

    By rule today, never by timing: the fields of
    ``cake_mhc_det_train.make_plan(n_streams, hidden_size, dtype, device)`` (read its
    docstring for the rule), in a plan of mode ``nondet``. Equal arguments give the equal
    plan.

    Raises:
        ValueError: as the det rule (``n_streams`` not in (2, 4, 8), ``hidden_size``
            outside [1, 65536], a bad dtype or device).
    """
    det = det_make_plan(n_streams, hidden_size, dtype, device)
    return cached_plan(_PLANS, (det,), lambda: from_det_plan(det))


def from_det_plan(det: MHCDetPlan) -> MHCNondetPlan:
    """The nondet plan with every field of ``det`` (the same launches)."""
    return MHCNondetPlan(**{f.name: getattr(det, f.name)
                            for f in dataclasses.fields(det) if f.name != "mode"})
