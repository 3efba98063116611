"""CausalConv1dNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_causal_conv1d_det_train.plan import CausalConv1dDetPlan
from cake_causal_conv1d_det_train.plan import make_plan as _det_make_plan
from cake_core import Mode
from cake_core.plan import cached_plan


@dataclasses.dataclass(frozen=True)
class CausalConv1dNondetPlan(CausalConv1dDetPlan):
    """Execution plan of the non-deterministic causal conv1d (``mode`` is ``nondet``): the
    fields, their meaning and their checks are ``CausalConv1dDetPlan``'s (tiles, warps,
    backward variants of cake-causal-conv1d-det-train's kernels, which this package runs).
    A det entry refuses it, and this package refuses a det plan (``ValueError``).
    """

    family: ClassVar[str] = "cake-causal-conv1d-nondet-train"
    format_version: ClassVar[int] = 1
    format_upgrades: ClassVar[dict[int, str]] = {}
    expected_mode: ClassVar[Mode] = Mode.NONDET

    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)


_PLANS: dict[tuple, CausalConv1dNondetPlan] = {}


def make_nondet_plan(hidden_size: int, kernel_size: int, dtype: torch.dtype,
                     device: torch.device | str, *,
                     varlen: bool = False) -> CausalConv1dNondetPlan:
    """The plan for ``hidden_size`` (D) channels, ``kernel_size`` (W) taps, ``dtype`` inputs
    on ``device``; ``varlen``: whether the calls pass ``cu_seqlens``.

    By rule today: the fields of ``cake_causal_conv1d_det_train.make_plan`` for the same
    arguments (no timing, no autotuning), in mode ``nondet``.

    Raises:
        ValueError: as ``cake_causal_conv1d_det_train.make_plan`` (``hidden_size`` not an
            int in [1, 2**20], ``kernel_size`` not an int in [2, 8], a bad ``device``).
    """
    det = _det_make_plan(hidden_size, kernel_size, dtype, device, varlen=varlen)
    key = (det.hidden_size, det.kernel_size, torch.device(device).type, bool(varlen))
    fields = {f.name: getattr(det, f.name) for f in dataclasses.fields(det) if f.name != "mode"}
    return cached_plan(_PLANS, key, lambda: CausalConv1dNondetPlan(**fields))
