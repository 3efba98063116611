"""Autograd entry (custom ops ``cake_rmsnorm_nondet_train::fwd`` / ``::bwd``) and the
low-level fwd/bwd of non-deterministic RMSNorm.

The math, checks and launches are cake-rmsnorm-det-train's (:mod:`cake_rmsnorm_det_train.api`,
run here with this package's :data:`NONDET_KINDS`): this package runs its kernels today, so
its speed is the det package's and its bits are not promised. What differs is the contract:
plans, saved sets and workspaces of mode ``nondet`` (a det entry refuses them, these
entries refuse det ones), and a backward that, under
``torch.use_deterministic_algorithms(True)``, raises ``RuntimeError`` before any launch
(with ``warn_only=True`` it warns once and runs); use ``cake_rmsnorm_det_train.rmsnorm_det``
for repeatable gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_rmsnorm_det_train.api import (
    ModeKinds,
    _RMSNormDetFunction,
    register_ops,
    run_autograd,
    run_bwd,
    run_fwd,
)

from cake_rmsnorm_nondet_train.plan import RMSNormNondetPlan, make_nondet_plan
from cake_rmsnorm_nondet_train.saved import RMSNormNondetSavedSet, RMSNormNondetWorkspace


class RMSNormNondetGrads(NamedTuple):
    """Gradients of :func:`rmsnorm_nondet_bwd`; ``None`` where there is none.

    dx: like x. dweight: like weight (``None`` when a ``dweight_accumulator`` received it).
    dresidual: like x, only with a residual (equal to dx).
    """

    dx: torch.Tensor | None
    dweight: torch.Tensor | None
    dresidual: torch.Tensor | None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_rmsnorm_nondet_train's backward", "cake_rmsnorm_det_train.rmsnorm_det")


class _RMSNormNondetFunction(_RMSNormDetFunction):
    """The eager autograd node of :func:`rmsnorm_nondet` (cake-rmsnorm-det-train's, under
    this package's name; its backward runs the alert first)."""


_DEFAULT_PLANS: dict[tuple, RMSNormNondetPlan] = {}

#: this package's kinds: nondet plans, saved sets and workspaces, ops
#: ``cake_rmsnorm_nondet_train::``, the deterministic-algorithms alert before a backward
NONDET_KINDS = ModeKinds(Mode.NONDET, RMSNormNondetPlan, RMSNormNondetSavedSet,
                         RMSNormNondetWorkspace, RMSNormNondetGrads, make_nondet_plan,
                         _DEFAULT_PLANS, "cake_rmsnorm_nondet_train", _RMSNormNondetFunction,
                         _deterministic_alert)

_fwd_op, _bwd_op = register_ops(NONDET_KINDS)


def rmsnorm_nondet(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                   offset: float = 0.0, residual: torch.Tensor | None = None,
                   plan: RMSNormNondetPlan | None = None,
                   workspace: RMSNormNondetWorkspace | None = None,
                   dweight_accumulator: torch.Tensor | None = None):
    """RMSNorm with autograd, not promised bitwise repeatable:
    ``y = h * rsqrt(mean(h**2, -1) + eps) * (offset + weight)`` with ``h = x``
    (``+ residual``).

    Arguments, shapes, dtypes, results and errors are those of
    ``cake_rmsnorm_det_train.rmsnorm_det``, with an :class:`RMSNormNondetPlan` (default
    :func:`~cake_rmsnorm_nondet_train.make_nondet_plan`) and an
    :class:`RMSNormNondetWorkspace`.

    Args:
        x: ``[..., H]``, any leading dims, last dim contiguous; fp32, bf16 or fp16.
            1 <= H <= 65536.
        weight: ``[H]``, fp32 or x's dtype.
        eps: > 0, added to the mean square (default 1e-6).
        offset: a real number finite in fp32, added to the weight in fp32 in the kernels
            (default 0; 1 for zero-centred weights, as Liger's ``offset``).
        residual: optional, like x. Then h = x + residual (rounded to x's dtype) is
            normalized and returned too.
        plan, workspace: of this package (mode nondet), for H.
        dweight_accumulator: optional fp32 ``[H]``; the backward adds dweight into it and
            ``weight`` gets no autograd gradient.

    Returns:
        ``y`` like x, or ``(y, h)`` with a residual.

    Raises:
        ValueError: bad shape, dtype, device, stride, eps; a plan or workspace of another
            type or mode (e.g. cake_rmsnorm_det_train's); before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).

    Example::

        import torch
        from cake_rmsnorm_nondet_train import rmsnorm_nondet
        x = torch.randn(8, 64, requires_grad=True)  # CPU: Triton's interpreter
        rmsnorm_nondet(x, torch.ones(64)).sum().backward()
    """
    return run_autograd(NONDET_KINDS, x, weight, eps, residual, plan, workspace,
                        dweight_accumulator, offset)


def rmsnorm_nondet_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                       offset: float = 0.0, residual: torch.Tensor | None = None,
                       plan: RMSNormNondetPlan | None = None):
    """Low-level forward without autograd: returns ``(outputs, saved)``.

    ``outputs`` is what :func:`rmsnorm_nondet` returns (``y`` or ``(y, h)``); ``saved`` is
    an :class:`RMSNormNondetSavedSet` for :func:`rmsnorm_nondet_bwd`. Arguments, shapes and
    errors as in :func:`rmsnorm_nondet`.
    """
    return run_fwd(NONDET_KINDS, x, weight, eps, residual, plan, offset)


def rmsnorm_nondet_bwd(dy: torch.Tensor, dh: torch.Tensor | None,
                       saved: RMSNormNondetSavedSet, *,
                       plan: RMSNormNondetPlan | None = None,
                       workspace: RMSNormNondetWorkspace | None = None,
                       dweight_accumulator: torch.Tensor | None = None) -> RMSNormNondetGrads:
    """Low-level backward: gradients from ``dy`` (grad of y) and ``dh`` (grad of the
    returned h, only with a residual; ``None`` means zero).

    Args:
        dy: like x (the saved input: same shape and dtype); dh: like x or ``None``.
        saved: the :class:`RMSNormNondetSavedSet` of :func:`rmsnorm_nondet_fwd`.
        plan: default: the forward's plan. workspace, dweight_accumulator: as in
            :func:`rmsnorm_nondet`.

    Returns:
        :class:`RMSNormNondetGrads` ``(dx, dweight, dresidual)``.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_rmsnorm_det_train's), shape/dtype/device mismatches, ``dh`` without a
            residual; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, after the checks
            and before any launch (``warn_only=True``: one warning, then it runs).
    """
    return run_bwd(NONDET_KINDS, dy, dh, saved, plan, workspace, dweight_accumulator)
