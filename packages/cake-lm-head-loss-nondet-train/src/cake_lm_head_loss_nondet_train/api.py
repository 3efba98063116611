"""Autograd entry, low-level forward / backward of the non-deterministic fused LM head +
cross entropy.

The math, arguments, shapes, dtypes and errors are cake-lm-head-loss-det-train's
(``cake_lm_head_loss_det_train.lm_head_loss_det``; its ``reference.py`` is the float64
spec). Today this package runs that package's kernels and launches, under its own plan,
saved set, workspace and custom ops (``cake_lm_head_loss_nondet_train::fwd`` / ``::bwd``),
so its speed is the det sibling's; its bits are not promised. Under
``torch.use_deterministic_algorithms(True)`` the backward raises ``RuntimeError`` before
any launch (with ``warn_only=True`` it warns once and runs); it never falls back to the det
package. (With the plan's ``grad_in_forward`` route, "mean" / "sum", the gradients are
computed in the forward, which is not refused; the backward only scales them.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import Mode, nondet_alert
from cake_lm_head_loss_det_train.api import (
    ModeClasses,
    _LMHeadLossDetFunction,
    bwd_call,
    fwd_call,
    loss_call,
    register_ops,
)

from cake_lm_head_loss_nondet_train.plan import LMHeadLossNondetPlan, make_nondet_plan
from cake_lm_head_loss_nondet_train.saved import (
    LMHeadLossNondetSavedSet,
    LMHeadLossNondetWorkspace,
)


class LMHeadLossNondetGrads(NamedTuple):
    """Gradients of :func:`lm_head_loss_nondet_bwd`; ``None`` where there is none.

    dhidden: like hidden. dweight: like weight (``None`` when ``main_grad`` received it).
    dbias: like bias, only with a bias.
    """

    dhidden: torch.Tensor | None
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_lm_head_loss_nondet_train's backward",
                 "cake_lm_head_loss_det_train.lm_head_loss_det")


class _LMHeadLossNondetFunction(_LMHeadLossDetFunction):
    """The eager autograd node (the det package's, under this package's name: its
    ``grad_fn`` reads ``_LMHeadLossNondetFunctionBackward``)."""


_M = ModeClasses(Mode.NONDET, LMHeadLossNondetPlan, LMHeadLossNondetSavedSet,
                 LMHeadLossNondetWorkspace, LMHeadLossNondetGrads, make_nondet_plan,
                 "cake_lm_head_loss_nondet_train", "lm_head_loss_nondet", _deterministic_alert,
                 _LMHeadLossNondetFunction)
_fwd_op, _bwd_op = register_ops(_M)


def lm_head_loss_nondet(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                        bias: torch.Tensor | None = None, ignore_index: int = -100,
                        reduction: str = "mean", label_smoothing: float = 0.0,
                        z_loss: float = 0.0, logit_softcap: float | None = None,
                        return_lse: bool = False, plan: LMHeadLossNondetPlan | None = None,
                        workspace: LMHeadLossNondetWorkspace | None = None,
                        main_grad: torch.Tensor | None = None):
    """Fused LM head + cross entropy with autograd, never materializing the whole ``[T, V]``
    logits; bits not promised repeatable.

    ``F.cross_entropy((hidden @ weight.T + bias).float(), labels, ignore_index=...,
    reduction=..., label_smoothing=...)`` plus ``z_loss * lse**2`` per non-ignored token,
    with optional tanh soft-capping of the logits. Arguments, shapes, dtypes, return value
    (``loss`` or ``(loss, lse)``) and errors are those of
    ``cake_lm_head_loss_det_train.lm_head_loss_det`` (hidden ``[T, H]`` / ``[B, S, H]``,
    weight ``[V, H]``, int64 labels, optional bias ``[V]`` and fp32 ``main_grad``
    ``[V, H]``), with ``plan`` an :class:`LMHeadLossNondetPlan` (default
    :func:`make_nondet_plan`) and ``workspace`` an :class:`LMHeadLossNondetWorkspace`.
    Under ``torch.compile`` the custom ops ``cake_lm_head_loss_nondet_train::fwd`` /
    ``::bwd``.

    The backward raises ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)``
    before any launch (``warn_only=True``: one warning, then it runs).

    Raises:
        ValueError: as ``lm_head_loss_det``, and a plan or workspace of the det package (or
            of another type or mode), before any launch.

    Example::

        import torch
        from cake_lm_head_loss_nondet_train import lm_head_loss_nondet
        h = torch.randn(24, 64, requires_grad=True)  # CPU: Triton's interpreter
        w = torch.randn(1000, 64, requires_grad=True)
        lm_head_loss_nondet(h, w, torch.randint(0, 1000, (24,))).backward()
    """
    return loss_call(_M, hidden, weight, labels, bias, ignore_index, reduction,
                     label_smoothing, z_loss, logit_softcap, return_lse, plan, workspace,
                     main_grad)


def lm_head_loss_nondet_fwd(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                            *, bias: torch.Tensor | None = None, ignore_index: int = -100,
                            reduction: str = "mean", label_smoothing: float = 0.0,
                            z_loss: float = 0.0, logit_softcap: float | None = None,
                            plan: LMHeadLossNondetPlan | None = None,
                            workspace: LMHeadLossNondetWorkspace | None = None):
    """The forward alone (no autograd): ``((loss, lse), saved)``, ``saved`` an
    :class:`LMHeadLossNondetSavedSet` for :func:`lm_head_loss_nondet_bwd`; arguments and
    errors as :func:`lm_head_loss_nondet`."""
    return fwd_call(_M, hidden, weight, labels, bias, ignore_index, reduction,
                    label_smoothing, z_loss, logit_softcap, plan, workspace)


def lm_head_loss_nondet_bwd(dloss: torch.Tensor, saved: LMHeadLossNondetSavedSet, *,
                            plan: LMHeadLossNondetPlan | None = None,
                            workspace: LMHeadLossNondetWorkspace | None = None,
                            main_grad: torch.Tensor | None = None) -> LMHeadLossNondetGrads:
    """The backward alone: :class:`LMHeadLossNondetGrads` ``(dhidden, dweight, dbias)``.

    Args:
        dloss: fp32; ``[]`` for "mean" / "sum", labels' shape for "none". saved: the
            :class:`LMHeadLossNondetSavedSet` of :func:`lm_head_loss_nondet_fwd`. plan,
            workspace, main_grad: as ``cake_lm_head_loss_det_train.lm_head_loss_det_bwd``'s,
            of this package.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_lm_head_loss_det_train's), ``dloss`` or ``main_grad`` of the wrong shape or
            dtype, devices that differ; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, before any
            launch.
    """
    return bwd_call(_M, dloss, saved, plan, workspace, main_grad)
