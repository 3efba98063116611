"""Autograd entry (custom ops ``cake_rmsnorm_silu_gate_nondet_train::fwd`` / ``::bwd``) and
the low-level fwd/bwd of non-deterministic gated RMSNorm.

The math, checks and launches are cake-rmsnorm-silu-gate-det-train's
(:mod:`cake_rmsnorm_silu_gate_det_train.api`, run here with this package's
:data:`NONDET_KINDS`): this package runs its kernels today, so its speed is the det
package's and its bits are not promised. What differs is the contract: plans, saved sets
and workspaces of mode ``nondet`` (a det entry refuses them, these entries refuse det
ones), and a backward that, under ``torch.use_deterministic_algorithms(True)``, raises
``RuntimeError`` before any launch (with ``warn_only=True`` it warns once and runs); use
``cake_rmsnorm_silu_gate_det_train.rmsnorm_silu_gate_det`` for repeatable gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_rmsnorm_silu_gate_det_train.api import (
    ModeKinds,
    _RMSNormSiluGateDetFunction,
    register_ops,
    run_autograd,
    run_bwd,
    run_fwd,
)

from cake_rmsnorm_silu_gate_nondet_train.plan import RMSNormSiluGateNondetPlan, make_nondet_plan
from cake_rmsnorm_silu_gate_nondet_train.saved import (
    RMSNormSiluGateNondetSavedSet,
    RMSNormSiluGateNondetWorkspace,
)


class RMSNormSiluGateNondetGrads(NamedTuple):
    """Gradients of :func:`rmsnorm_silu_gate_nondet_bwd`.

    dx: like x. dz: like z. dweight: like weight (``None`` when a ``dweight_accumulator``
    received it).
    """

    dx: torch.Tensor
    dz: torch.Tensor
    dweight: torch.Tensor | None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_rmsnorm_silu_gate_nondet_train's backward",
                 "cake_rmsnorm_silu_gate_det_train.rmsnorm_silu_gate_det")


class _RMSNormSiluGateNondetFunction(_RMSNormSiluGateDetFunction):
    """The eager autograd node of :func:`rmsnorm_silu_gate_nondet`
    (cake-rmsnorm-silu-gate-det-train's, under this package's name; its backward runs the
    alert first)."""


_DEFAULT_PLANS: dict[tuple, RMSNormSiluGateNondetPlan] = {}

#: this package's kinds: nondet plans, saved sets and workspaces, ops
#: ``cake_rmsnorm_silu_gate_nondet_train::``, the deterministic-algorithms alert before a
#: backward
NONDET_KINDS = ModeKinds(Mode.NONDET, RMSNormSiluGateNondetPlan, RMSNormSiluGateNondetSavedSet,
                         RMSNormSiluGateNondetWorkspace, RMSNormSiluGateNondetGrads,
                         make_nondet_plan, _DEFAULT_PLANS, "cake_rmsnorm_silu_gate_nondet_train",
                         _RMSNormSiluGateNondetFunction, _deterministic_alert)

_fwd_op, _bwd_op = register_ops(NONDET_KINDS)


def rmsnorm_silu_gate_nondet(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                             eps: float = 1e-6, *, norm_before_gate: bool = True,
                             group_size: int | None = None, activation: str = "silu",
                             plan: RMSNormSiluGateNondetPlan | None = None,
                             workspace: RMSNormSiluGateNondetWorkspace | None = None,
                             dweight_accumulator: torch.Tensor | None = None) -> torch.Tensor:
    """Gated RMSNorm (SiLU or sigmoid gate) with autograd, not promised bitwise repeatable.

    ``norm_before_gate=True`` (FLA, Qwen3-Next, KDA)::

        y = x * rsqrt(mean(x**2) + eps) * weight * gate(z)

    ``norm_before_gate=False`` (Mamba2)::

        u = x * gate(z);  y = u * rsqrt(mean(u**2) + eps) * weight

    with ``gate(z) = silu(z)`` (``activation="silu"`` / ``"swish"``) or ``sigmoid(z)``
    (``"sigmoid"``), the mean over the last dim D or over each group of ``group_size``.
    Arguments, shapes, dtypes, results and errors are those of
    ``cake_rmsnorm_silu_gate_det_train.rmsnorm_silu_gate_det``, with an
    :class:`RMSNormSiluGateNondetPlan` (default
    :func:`~cake_rmsnorm_silu_gate_nondet_train.make_nondet_plan`) and an
    :class:`RMSNormSiluGateNondetWorkspace`.

    Args:
        x: ``[..., D]``, last dim contiguous; fp32, bf16 or fp16. 1 <= D <= 65536.
        z: the gate, like x.
        weight: ``[D]``, fp32 or x's dtype.
        eps: finite, > 0 (default 1e-6).
        norm_before_gate, group_size, activation: as the det entry.
        plan, workspace: of this package (mode nondet), for (D, G).
        dweight_accumulator: optional fp32 ``[D]``; the backward adds dweight into it and
            ``weight`` gets no autograd gradient.

    Returns:
        ``y`` like x.

    Raises:
        ValueError: bad shape, dtype, device, stride, eps, group_size, norm_before_gate,
            activation; a plan or workspace of another type or mode (e.g.
            cake_rmsnorm_silu_gate_det_train's); before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).
    """
    return run_autograd(NONDET_KINDS, x, z, weight, eps, norm_before_gate, group_size,
                        activation, plan, workspace, dweight_accumulator)


def rmsnorm_silu_gate_nondet_fwd(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                                 eps: float = 1e-6, *, norm_before_gate: bool = True,
                                 group_size: int | None = None, activation: str = "silu",
                                 plan: RMSNormSiluGateNondetPlan | None = None,
                                 ) -> tuple[torch.Tensor, RMSNormSiluGateNondetSavedSet]:
    """Low-level forward without autograd: returns ``(y, saved)``, ``saved`` an
    :class:`RMSNormSiluGateNondetSavedSet` for :func:`rmsnorm_silu_gate_nondet_bwd`.
    Arguments, math, shapes and errors as in :func:`rmsnorm_silu_gate_nondet`."""
    return run_fwd(NONDET_KINDS, x, z, weight, eps, norm_before_gate, group_size, activation,
                   plan)


def rmsnorm_silu_gate_nondet_bwd(dy: torch.Tensor, saved: RMSNormSiluGateNondetSavedSet, *,
                                 plan: RMSNormSiluGateNondetPlan | None = None,
                                 workspace: RMSNormSiluGateNondetWorkspace | None = None,
                                 dweight_accumulator: torch.Tensor | None = None,
                                 ) -> RMSNormSiluGateNondetGrads:
    """Low-level backward: gradients of x, z and weight from ``dy`` (the gradient of y);
    the gate and the order are the forward's, read from ``saved``.

    Args:
        dy: like x (same shape and dtype).
        saved: the :class:`RMSNormSiluGateNondetSavedSet` of
            :func:`rmsnorm_silu_gate_nondet_fwd`.
        plan: default: the forward's plan; another must have the same (D, G).
        workspace, dweight_accumulator: as in :func:`rmsnorm_silu_gate_nondet`.

    Returns:
        :class:`RMSNormSiluGateNondetGrads` ``(dx, dz, dweight)``.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_rmsnorm_silu_gate_det_train's); ``dy`` not of x's shape and dtype; a bad
            accumulator; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, after the checks
            and before any launch (``warn_only=True``: one warning, then it runs).
    """
    return run_bwd(NONDET_KINDS, dy, saved, plan, workspace, dweight_accumulator)
