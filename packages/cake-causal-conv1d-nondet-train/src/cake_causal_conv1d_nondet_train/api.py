"""Autograd entry, low-level forward / backward of the non-deterministic causal depthwise
conv1d.

The math, arguments, shapes, dtypes and errors are cake-causal-conv1d-det-train's
(``cake_causal_conv1d_det_train.causal_conv1d_det``; its ``reference.py`` is the float64
spec). Today this package runs that package's kernels and launches, under its own plan,
saved set, workspace and custom ops (``cake_causal_conv1d_nondet_train::fwd`` / ``::bwd``),
so its speed is the det sibling's; its bits are not promised. Under
``torch.use_deterministic_algorithms(True)`` the backward raises ``RuntimeError`` before
any launch (with ``warn_only=True`` it warns once and runs); it never falls back to the det
package.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_causal_conv1d_det_train.api import (
    ModeClasses,
    _CausalConv1dDetFunction,
    bwd_call,
    conv_call,
    fwd_call,
    register_ops,
)
from cake_core import Mode, nondet_alert

from cake_causal_conv1d_nondet_train.plan import CausalConv1dNondetPlan, make_nondet_plan
from cake_causal_conv1d_nondet_train.saved import (
    CausalConv1dNondetSavedSet,
    CausalConv1dNondetWorkspace,
)


class CausalConv1dNondetGrads(NamedTuple):
    """Gradients of :func:`causal_conv1d_nondet_bwd`; ``None`` where there is none.

    dx: ``[B, T, D]`` in x's dtype (contiguous). dweight: ``[D, W]`` in weight's dtype.
    dbias: ``[D]`` in bias's dtype, only with a bias. dinitial_state: ``[N, D, W - 1]`` in
    the initial state's dtype, only with an initial state.
    """

    dx: torch.Tensor
    dweight: torch.Tensor
    dbias: torch.Tensor | None
    dinitial_state: torch.Tensor | None


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_causal_conv1d_nondet_train's backward",
                 "cake_causal_conv1d_det_train.causal_conv1d_det")


class _CausalConv1dNondetFunction(_CausalConv1dDetFunction):
    """The eager autograd node (the det package's, under this package's name: its
    ``grad_fn`` reads ``_CausalConv1dNondetFunctionBackward``)."""


_M = ModeClasses(Mode.NONDET, CausalConv1dNondetPlan, CausalConv1dNondetSavedSet,
                 CausalConv1dNondetWorkspace, CausalConv1dNondetGrads, make_nondet_plan,
                 "cake_causal_conv1d_nondet_train", _deterministic_alert,
                 _CausalConv1dNondetFunction)
_fwd_op, _bwd_op = register_ops(_M)


def causal_conv1d_nondet(x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, *, activation: str | None = None,
                         cu_seqlens: torch.Tensor | None = None,
                         initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False,
                         plan: CausalConv1dNondetPlan | None = None,
                         workspace: CausalConv1dNondetWorkspace | None = None):
    """Causal depthwise conv1d with autograd, bits not promised repeatable.

    ``y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c])`` within each
    sequence. Arguments, shapes, dtypes, return value ``(y, final_state)`` and errors are
    those of ``cake_causal_conv1d_det_train.causal_conv1d_det`` (x ``[B, T, D]`` or packed
    ``[1, T, D]`` with ``cu_seqlens``; weight ``[D, W]``, 2 <= W <= 8; activation None /
    "silu" / "swish"; states ``[N, D, W - 1]``), with ``plan`` a
    :class:`CausalConv1dNondetPlan` (default :func:`make_nondet_plan`) and ``workspace`` a
    :class:`CausalConv1dNondetWorkspace`. Under ``torch.compile`` the custom ops
    ``cake_causal_conv1d_nondet_train::fwd`` / ``::bwd``.

    The backward raises ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)``
    before any launch (``warn_only=True``: one warning, then it runs).

    Raises:
        ValueError: as ``causal_conv1d_det``, and a plan or workspace of the det package
            (or of another type or mode), before any launch.

    Example::

        import torch
        from cake_causal_conv1d_nondet_train import causal_conv1d_nondet
        x = torch.randn(2, 40, 64, requires_grad=True)  # CPU: Triton's interpreter
        w = torch.randn(64, 4, requires_grad=True)
        y, _ = causal_conv1d_nondet(x, w, activation="silu")
        y.sum().backward()
    """
    return conv_call(_M, x, weight, bias, activation, cu_seqlens, initial_state,
                     output_final_state, plan, workspace)


def causal_conv1d_nondet_fwd(x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None, *,
                             activation: str | None = None,
                             cu_seqlens: torch.Tensor | None = None,
                             initial_state: torch.Tensor | None = None,
                             output_final_state: bool = False,
                             plan: CausalConv1dNondetPlan | None = None):
    """The forward alone (no autograd): ``(y, final_state, saved)``, ``saved`` a
    :class:`CausalConv1dNondetSavedSet` for :func:`causal_conv1d_nondet_bwd`; arguments
    and errors as :func:`causal_conv1d_nondet`."""
    return fwd_call(_M, x, weight, bias, activation, cu_seqlens, initial_state,
                    output_final_state, plan)


def causal_conv1d_nondet_bwd(dy: torch.Tensor, dfinal_state: torch.Tensor | None,
                             saved: CausalConv1dNondetSavedSet, *,
                             plan: CausalConv1dNondetPlan | None = None,
                             workspace: CausalConv1dNondetWorkspace | None = None,
                             ) -> CausalConv1dNondetGrads:
    """The backward alone: :class:`CausalConv1dNondetGrads` ``(dx, dweight, dbias,
    dinitial_state)``.

    Args:
        dy: ``[B, T, D]``, fp32 / bf16 / fp16, channels contiguous. dfinal_state:
            ``[N, D, W - 1]`` or None. saved: the :class:`CausalConv1dNondetSavedSet` of
            :func:`causal_conv1d_nondet_fwd`. plan / workspace: as
            ``cake_causal_conv1d_det_train.causal_conv1d_det_bwd``'s, of this package.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_causal_conv1d_det_train's), dy / dfinal_state of the wrong shape, dtype,
            layout or device; before any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, before any
            launch.
    """
    return bwd_call(_M, dy, dfinal_state, saved, plan, workspace)
