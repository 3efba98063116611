"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the nondet
MoE grouped GEMM (``torch._grouped_mm(x, weight.transpose(-2, -1), offs)`` semantics).

The math, the checks and the launches are cake-moe-grouped-det-gemm's
(:mod:`cake_moe_grouped_det_gemm.api`): this module runs that package's kernels with a
:class:`MoEGroupedNondetPlan`, under its own custom ops (``cake_moe_grouped_nondet_gemm::fwd``
/ ``::bwd``). Its bits are not promised. Under ``torch.use_deterministic_algorithms(True)``
the backward raises ``RuntimeError`` before any launch (with ``warn_only=True`` it warns
once and runs); use ``cake_moe_grouped_det_gemm.moe_grouped_det_gemm`` for repeatable
gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_dtype,
    check_same_device,
    check_shape,
    check_tensor,
    nondet_alert,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import plan_to_op_fields
from cake_core.triton_utils import launch_device_check
from cake_moe_grouped_det_gemm.api import (
    _check_main_grad,
    _checks,
    _launch_bwd,
    _launch_fwd,
    _resolve_plan,
    _resolve_workspace,
    _row_ends,
    register_ops,
)

from cake_moe_grouped_nondet_gemm.plan import MoEGroupedNondetPlan, make_nondet_plan
from cake_moe_grouped_nondet_gemm.saved import (
    MoEGroupedNondetSavedSet,
    MoEGroupedNondetWorkspace,
)

_OP = "cake_moe_grouped_nondet_gemm"


class MoEGroupedNondetGrads(NamedTuple):
    """Gradients of :func:`moe_grouped_nondet_gemm_bwd`.

    dx: like x (``[M, K]``, contiguous). dweight: ``[E, N, K]`` in weight's dtype
    (``None`` when ``main_grad`` received it).
    """

    dx: torch.Tensor
    dweight: torch.Tensor | None


def _alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_moe_grouped_nondet_gemm's backward",
                 "cake_moe_grouped_det_gemm.moe_grouped_det_gemm")


def _resolve_nondet_plan(plan, M, E: int, N: int, K: int, dtype: torch.dtype,
                        device: torch.device) -> MoEGroupedNondetPlan:
    """``plan`` (or :func:`make_nondet_plan`'s) checked as the det package checks its own:
    a :class:`MoEGroupedNondetPlan` for (E, N, K), dtype and device."""
    return _resolve_plan(plan, M, E, N, K, dtype, device, plan_cls=MoEGroupedNondetPlan,
                         rule=make_nondet_plan)


def _nondet_checks(x, weight, offs, m_sizes, plan, workspace, main_grad, *,
                   launch: bool = True):
    """The det entry's checks with this package's plan, rule and workspace classes (also
    :func:`is_supported_nondet`'s) -> ``(device, plan, partials)``."""
    return _checks(x, weight, offs, m_sizes, plan, workspace, main_grad,
                   plan_cls=MoEGroupedNondetPlan, rule=make_nondet_plan,
                   ws_cls=MoEGroupedNondetWorkspace, launch=launch)


def _workspace(workspace, plan, device):
    return _resolve_workspace(workspace, plan, device, ws_cls=MoEGroupedNondetWorkspace)


# ----------------------------------------------------------------------------- custom ops


register_ops(_OP, MoEGroupedNondetPlan, Mode.NONDET, before_bwd=_alert)


class _MoEGroupedNondetFunction(torch.autograd.Function):
    """Eager path (the det package's launches; the workspace buffer and ``main_grad`` on
    ctx as attributes, as the det package keeps them)."""

    @staticmethod
    def forward(ctx, x, weight, ends, plan, partials, main_grad, full=False):
        y = _launch_fwd(x, weight, ends, plan, full)
        ctx.plan, ctx.partials, ctx.main_grad, ctx.full = plan, partials, main_grad, full
        ctx.save_for_backward(x, weight, ends)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        _alert()  # before anything is launched
        x, weight, ends = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dx, dw = _launch_bwd(dy, x, weight, ends, ctx.plan, ctx.partials, ctx.main_grad,
                             need_dx, need_dw, ctx.full)
        return (dx if need_dx else None, dw if need_dw and ctx.main_grad is None else None,
                None, None, None, None, None)


# ----------------------------------------------------------------------------- public API


def moe_grouped_nondet_gemm(x: torch.Tensor, weight: torch.Tensor,
                            offs: torch.Tensor | None = None, *,
                            m_sizes: torch.Tensor | None = None,
                            plan: MoEGroupedNondetPlan | None = None,
                            workspace: MoEGroupedNondetWorkspace | None = None,
                            main_grad: torch.Tensor | None = None) -> torch.Tensor:
    """MoE grouped GEMM with autograd, bits not promised:
    ``y[rows of e] = x[rows of e] · weight[e]ᵀ``.

    Arguments (x ``[M, K]`` sorted by expert, weight ``[E, N, K]``, int32 ``offs`` or
    ``m_sizes`` ``[E]``, ``main_grad``), shapes, dtypes, checks and errors are those of
    ``cake_moe_grouped_det_gemm.moe_grouped_det_gemm``, with a :class:`MoEGroupedNondetPlan`
    (default: :func:`make_nondet_plan`) and a :class:`MoEGroupedNondetWorkspace`. It runs
    that package's kernels today.

    Raises:
        ValueError: bad shape, dtype, device, offsets, plan, workspace or mode (a det plan
            or workspace), before any launch; the caller's tensors are not modified.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).
    """
    _, plan, partials = _nondet_checks(x, weight, offs, m_sizes, plan, workspace, main_grad)
    return _apply(x, weight, _row_ends(offs, m_sizes, x.shape[0]), plan, partials, main_grad)


def routed_nondet_gemm(x, weight, ends, *, plan=None):
    """:func:`moe_grouped_nondet_gemm` over row ends the MoE layer's routing built (int32
    ``[E]``, contiguous, non-decreasing, the last one M): no clamping launch, no zeroing
    of rows past the last end."""
    _, plan, partials = _nondet_checks(x, weight, ends, None, plan, None, None)
    return _apply(x, weight, ends, plan, partials, None, full=True)


def _apply(x, weight, ends, plan, partials, main_grad, full=False):
    if not torch.compiler.is_compiling():
        return _MoEGroupedNondetFunction.apply(x, weight, ends, plan, partials, main_grad,
                                               full)
    return torch.ops.cake_moe_grouped_nondet_gemm.fwd(
        x, weight, ends, plan_to_op_fields(plan), partials, main_grad, full)


def moe_grouped_nondet_gemm_fwd(x: torch.Tensor, weight: torch.Tensor,
                                offs: torch.Tensor | None = None, *,
                                m_sizes: torch.Tensor | None = None,
                                plan: MoEGroupedNondetPlan | None = None):
    """Low-level forward without autograd: ``(y, saved)``, ``saved`` a
    :class:`MoEGroupedNondetSavedSet` for :func:`moe_grouped_nondet_gemm_bwd`. Arguments,
    shapes, checks and errors as :func:`moe_grouped_nondet_gemm`."""
    _, plan, _ = _nondet_checks(x, weight, offs, m_sizes, plan, None, None)
    M = x.shape[0]
    with torch.no_grad():
        ends = _row_ends(offs, m_sizes, M)
        y = _launch_fwd(x, weight, ends, plan)
    saved = MoEGroupedNondetSavedSet(Mode.NONDET, {"x": x, "weight": weight, "ends": ends},
                                     meta={"plan": plan})
    return y, saved


def moe_grouped_nondet_gemm_bwd(dy: torch.Tensor, saved: MoEGroupedNondetSavedSet, *,
                                plan: MoEGroupedNondetPlan | None = None,
                                workspace: MoEGroupedNondetWorkspace | None = None,
                                main_grad: torch.Tensor | None = None
                                ) -> MoEGroupedNondetGrads:
    """Low-level backward: :class:`MoEGroupedNondetGrads` ``(dx, dweight)`` from ``dy``
    ``[M, N]`` (x's dtype) and the saved set of :func:`moe_grouped_nondet_gemm_fwd`;
    ``plan`` defaults to the forward's, workspace and main_grad as in
    :func:`moe_grouped_nondet_gemm`.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_moe_grouped_det_gemm's), shape / dtype / device mismatches; before any
            launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, before any launch
            (``warn_only=True``: one warning, then it runs).
    """
    require_mode(saved, MoEGroupedNondetSavedSet, Mode.NONDET, name="saved")
    x, weight, ends = saved.tensors()
    M = x.shape[0]
    E, N, K = weight.shape
    check_tensor(dy, "dy")
    check_shape(dy, "dy", [M, N], layout="[M, N]: the output's, x's rows by out_features")
    check_dtype(dy, "dy", (x.dtype,))
    _check_main_grad(main_grad, E, N, K)
    device = check_same_device(("saved", x), ("dy", dy), ("main_grad", main_grad))
    launch_device_check(device, "dy")
    plan = _resolve_nondet_plan(plan if plan is not None else saved.plan, M, E, N, K, x.dtype,
                               device)
    partials = _workspace(workspace, plan, device)
    _alert()
    with torch.no_grad():
        dx, dw = _launch_bwd(dy, x, weight, ends, plan, partials, main_grad, True, True)
    return MoEGroupedNondetGrads(dx, dw if main_grad is None else None)
