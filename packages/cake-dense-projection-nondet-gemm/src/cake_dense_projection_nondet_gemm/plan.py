"""DenseProjectionNondetPlan (mode ``nondet``) and the rule that picks it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from cake_core import Mode
from cake_core.plan import cached_plan
from cake_dense_projection_det_gemm.plan import DenseProjectionDetPlan
from cake_dense_projection_det_gemm.plan import make_plan as det_make_plan


@dataclasses.dataclass(frozen=True)
class DenseProjectionNondetPlan(DenseProjectionDetPlan):
    """Execution plan of the nondet dense projection (``mode`` is ``nondet``).

    The fields, their meaning and their checks are cake-dense-projection-det-gemm's
    ``DenseProjectionDetPlan`` (tiles, warps, stages, ``wgrad_splits``, ``reduce_block``,
    ``allow_tf32``, ``cublas_fwd_dgrad``, ``wgrad_tma``, ``fp32_dots``): this package runs
    that package's kernels with them. A det entry refuses this plan and this package
    refuses the det one (``ValueError``). ``to_dict()`` / ``from_dict()`` as every cake
    plan (format version 1).

    One field of its own:
        cublas_wgrad: 1 computes the weight gradient with cuBLAS (``torch.mm``; for an fp32
            ``main_grad`` its fp32 product, ``out_dtype=float32``, then added) and the bias
            gradient with ``torch.sum``, instead of the det package's fixed-order wgrad and
            dbias kernels; the ``wgrad_*`` fields and ``wgrad_splits`` are then unused.
            cuBLAS picks its kernel (and its reduction order) by its own heuristics. 0 = the
            det package's kernels.
    """

    family: ClassVar[str] = "cake-dense-projection-nondet-gemm"
    format_version: ClassVar[int] = 1
    format_upgrades: ClassVar[dict[int, str]] = {}
    expected_mode: ClassVar[Mode] = Mode.NONDET
    mode: Mode = dataclasses.field(default=Mode.NONDET, kw_only=True)
    cublas_wgrad: int = dataclasses.field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_flags("cublas_wgrad")


_PLANS: dict[tuple, DenseProjectionNondetPlan] = {}


def make_nondet_plan(M: int, N: int, K: int, dtype: torch.dtype,
                     device: torch.device | str) -> DenseProjectionNondetPlan:
    """The plan for ``y[M, N] = x[M, K] · W[N, K]ᵀ`` in ``dtype`` on ``device``.

    By rule, never by timing: the fields of
    ``cake_dense_projection_det_gemm.make_plan(M, N, K, dtype, device)`` (read its
    docstring for the rule), in a plan of mode ``nondet``, and on CUDA for bf16 / fp16
    (where the det rule already routes the forward and dgrad to cuBLAS)
    ``cublas_wgrad = 1`` with ``wgrad_splits = 1`` (no workspace): the det package's
    fixed-order wgrad is slower than cuBLAS's (docs/benchmarks/dense_projection.md). CPU
    and fp32: the det plan's fields.
    Equal arguments give the equal plan (cached).

    Raises:
        ValueError: as the det rule (M < 0, N or K < 1 or not ints, a dtype other than
            fp32 / bf16 / fp16, a bad device).
    """
    det = det_make_plan(M, N, K, dtype, device)
    return cached_plan(_PLANS, (det,), lambda: from_det_plan(det))


def from_det_plan(det: DenseProjectionDetPlan) -> DenseProjectionNondetPlan:
    """The nondet plan of the rule: every field of ``det``, and cuBLAS for the wgrad where
    ``det`` routes the forward and dgrad to it."""
    fields = {f.name: getattr(det, f.name) for f in dataclasses.fields(det) if f.name != "mode"}
    if det.cublas_fwd_dgrad:
        fields.update(cublas_wgrad=1, wgrad_splits=1)
    return DenseProjectionNondetPlan(**fields)
