"""KDANondetPlan (mode ``nondet``) and the rule that picks it (today cake-kda-det-train's
rule: shapes, dtype and device; no timing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_core.plan import cached_plan
from cake_kda_det_train.plan import KDADetPlan
from cake_kda_det_train.plan import make_plan as _det_rule


@dataclasses.dataclass(frozen=True)
class KDANondetPlan(KDADetPlan):
    """Execution plan of cake-kda-nondet-train's chunked Kimi Delta Attention (``mode`` is
    ``nondet``; any other mode raises ``ValueError``).

    The same fields, limits and checks as ``cake_kda_det_train.KDADetPlan`` (its docstring
    gives each field's meaning and the rule's reason): this package runs cake-kda-det-train's
    kernels today, launched with these fields. A det entry refuses this plan and this
    package's entries refuse a ``KDADetPlan``. Serialises with ``to_dict`` / ``from_dict``
    (family ``cake-kda-nondet-train``, format version 1).
    """

    family: ClassVar[str] = "cake-kda-nondet-train"
    format_version: ClassVar[int] = 1
    expected_mode: ClassVar[Mode] = Mode.NONDET

    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, KDANondetPlan] = {}


def make_nondet_plan(head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
                     device: torch.device | str) -> KDANondetPlan:
    """Pick the plan for heads of ``head_k_dim`` (K) and ``head_v_dim`` (V) on ``device``.

    Today the rule is cake-kda-det-train's ``make_plan`` (shapes, dtype and device; no
    timing), its fields carried over to a :class:`KDANondetPlan`: the same launches.

    Raises:
        ValueError: K or V outside [1, 256], ``dtype`` not fp32/bf16/fp16, a bad device, or
            on CUDA the limits of ``cake_kda_det_train.plan.cuda_plan_problem``.
    """
    det = _det_rule(head_k_dim, head_v_dim, dtype, device)  # every check
    return cached_plan(_PLANS, (det,), lambda: _from_det(det))


def _from_det(det: KDADetPlan) -> KDANondetPlan:
    fields = {f.name: getattr(det, f.name) for f in dataclasses.fields(det) if f.name != "mode"}
    return KDANondetPlan(**fields)


__all__ = ["KDANondetPlan", "make_nondet_plan"]
