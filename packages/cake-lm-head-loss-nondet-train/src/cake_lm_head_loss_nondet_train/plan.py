"""LMHeadLossNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_core.plan import cached_plan
from cake_lm_head_loss_det_train.plan import LMHeadLossDetPlan
from cake_lm_head_loss_det_train.plan import make_plan as _det_make_plan


@dataclasses.dataclass(frozen=True)
class LMHeadLossNondetPlan(LMHeadLossDetPlan):
    """Execution plan of the non-deterministic LM-head loss (``mode`` is ``nondet``): the
    fields, their meaning and their checks are ``LMHeadLossDetPlan``'s (chunk tokens, tiles,
    cuBLAS route, gradient route of cake-lm-head-loss-det-train's kernels, which this
    package runs). A det entry refuses it, and this package refuses a det plan
    (``ValueError``).
    """

    family: ClassVar[str] = "cake-lm-head-loss-nondet-train"
    format_version: ClassVar[int] = 1
    format_upgrades: ClassVar[dict[int, str]] = {}
    expected_mode: ClassVar[Mode] = Mode.NONDET

    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, LMHeadLossNondetPlan] = {}


def make_nondet_plan(hidden_size: int, vocab_size: int, dtype: torch.dtype,
                     device: torch.device | str, *,
                     reduction: str = "mean") -> LMHeadLossNondetPlan:
    """The plan for rows of ``hidden_size`` against a ``vocab_size`` vocabulary, ``dtype``
    inputs on ``device``, for ``reduction``.

    By rule today: the fields of ``cake_lm_head_loss_det_train.make_plan`` for the same
    arguments (no timing, no autotuning; the token count is not an input), in mode
    ``nondet``.

    Raises:
        ValueError: as ``cake_lm_head_loss_det_train.make_plan`` (a size out of range, a
            dtype other than fp32 / bf16 / fp16, an unknown reduction or device).
    """
    det = _det_make_plan(hidden_size, vocab_size, dtype, device, reduction=reduction)
    key = (det,)  # the det rule's plan (it reads the device's capability)
    fields = {f.name: getattr(det, f.name) for f in dataclasses.fields(det) if f.name != "mode"}
    return cached_plan(_PLANS, key, lambda: LMHeadLossNondetPlan(**fields))
