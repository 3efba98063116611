"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the nondet
dense projection (``torch.nn.functional.linear``).

The math and the checks are cake-dense-projection-det-gemm's
(:mod:`cake_dense_projection_det_gemm.api`), and so are the forward and dgrad launches;
the weight and bias gradients go to cuBLAS and ``torch.sum`` where the plan says so
(``cublas_wgrad``, the CUDA rule for bf16 / fp16), else to that package's kernels. Custom
ops ``cake_dense_projection_nondet_gemm::fwd`` / ``::bwd``. Its bits are not promised.
Under ``torch.use_deterministic_algorithms(True)`` the backward raises ``RuntimeError``
before any launch (with ``warn_only=True`` it warns once and runs); use
``cake_dense_projection_det_gemm.dense_projection_det`` for repeatable gradients.
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
from cake_dense_projection_det_gemm.api import (
    _check_main_grad,
    _checks,
    _launch_bwd,
    _launch_fwd,
    _resolve_plan,
    _resolve_workspace,
    register_ops,
)

from cake_dense_projection_nondet_gemm.plan import DenseProjectionNondetPlan, make_nondet_plan
from cake_dense_projection_nondet_gemm.saved import (
    DenseProjectionNondetSavedSet,
    DenseProjectionNondetWorkspace,
)

_OP = "cake_dense_projection_nondet_gemm"


class DenseProjectionNondetGrads(NamedTuple):
    """Gradients of :func:`dense_projection_nondet_bwd`; ``None`` where there is none.

    dx: like x. dweight: like weight (``None`` when ``main_grad`` received it).
    dbias: ``[N]`` in bias's dtype, only when the forward had a bias.
    """

    dx: torch.Tensor | None
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None


def _alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_dense_projection_nondet_gemm's backward",
                 "cake_dense_projection_det_gemm.dense_projection_det")


def _plan(plan, M, N, K, dtype, device) -> DenseProjectionNondetPlan:
    return _resolve_plan(plan, M, N, K, dtype, device, plan_cls=DenseProjectionNondetPlan,
                         rule=make_nondet_plan)


def _nondet_checks(x, weight, bias, plan, workspace, main_grad, *, launch: bool = True):
    """The det entry's checks with this package's plan, rule and workspace classes (also
    :func:`is_supported_nondet`'s) -> ``(device, plan, (partials, bias_partials))``."""
    return _checks(x, weight, bias, plan, workspace, main_grad,
                   plan_cls=DenseProjectionNondetPlan, rule=make_nondet_plan,
                   ws_cls=DenseProjectionNondetWorkspace, launch=launch)


def _workspace(workspace, plan, device):
    return _resolve_workspace(workspace, plan, device, ws_cls=DenseProjectionNondetWorkspace)


def _launch_bwd_nondet(dy, x, weight, plan: DenseProjectionNondetPlan, partials,
                       bias_partials, main_grad, need_dx: bool, need_dw: bool,
                       need_db: bool):
    """The det package's ``_launch_bwd``, with the weight and bias gradients from cuBLAS
    and ``torch.sum`` when ``plan.cublas_wgrad``; returns ``(dx, dw, db)`` as it does."""
    if not plan.cublas_wgrad:
        return _launch_bwd(dy, x, weight, plan, partials, bias_partials, main_grad,
                           need_dx, need_dw, need_db)
    dx, _, _ = _launch_bwd(dy, x, weight, plan, None, None, None, need_dx, False, False)
    N, K = weight.shape
    M = x.numel() // K
    dy2, x2 = dy.reshape(M, N), x.reshape(M, K)
    dw = torch.empty((N, K) if need_dw and main_grad is None else (0,), dtype=weight.dtype,
                     device=x.device)
    if need_dw and main_grad is not None:
        if dy2.dtype == torch.float32:
            main_grad.addmm_(dy2.t(), x2)
        elif main_grad.is_cuda:  # cuBLAS's fp32 product of the 16-bit operands, then added
            main_grad.add_(torch.mm(dy2.t(), x2, out_dtype=torch.float32))
        else:  # CPU has no mixed-dtype addmm
            main_grad.addmm_(dy2.t().float(), x2.float())
    elif need_dw:
        torch.mm(dy2.t(), x2, out=dw)
    db = torch.empty((N,) if need_db else (0,), dtype=x.dtype, device=x.device)
    if need_db:
        torch.sum(dy2, 0, out=db)
    return dx, dw, db


# ----------------------------------------------------------------------------- custom ops


register_ops(_OP, DenseProjectionNondetPlan, Mode.NONDET, before_bwd=_alert,
             launch_bwd=_launch_bwd_nondet)


class _DenseProjectionNondetFunction(torch.autograd.Function):
    """Eager path (the det package's launches; workspace buffers and ``main_grad`` on ctx
    as attributes, as the det package keeps them)."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan, partials, bias_partials, main_grad):
        y = _launch_fwd(x, weight, bias, plan)
        ctx.has_bias = bias is not None
        ctx.plan, ctx.partials, ctx.bias_partials = plan, partials, bias_partials
        ctx.main_grad = main_grad
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        _alert()  # before anything is launched
        x, weight = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_db = need_db and ctx.has_bias
        dx, dw, db = _launch_bwd_nondet(dy, x, weight, ctx.plan, ctx.partials,
                                        ctx.bias_partials, ctx.main_grad, need_dx, need_dw,
                                        need_db)
        return (dx if need_dx else None, dw if need_dw and ctx.main_grad is None else None,
                db if need_db else None, None, None, None, None)


# ----------------------------------------------------------------------------- public API


def dense_projection_nondet(x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None, *,
                            plan: DenseProjectionNondetPlan | None = None,
                            workspace: DenseProjectionNondetWorkspace | None = None,
                            main_grad: torch.Tensor | None = None) -> torch.Tensor:
    """Dense projection with autograd, bits not promised: ``y = x · weightᵀ + bias``.

    Arguments, shapes, dtypes, ``main_grad`` fusion and errors are those of
    ``cake_dense_projection_det_gemm.dense_projection_det``, with a
    :class:`DenseProjectionNondetPlan` (default: :func:`make_nondet_plan`) and a
    :class:`DenseProjectionNondetWorkspace`. On CUDA in bf16 / fp16 the weight and bias
    gradients come from cuBLAS and ``torch.sum`` (the plan's ``cublas_wgrad``); elsewhere
    it runs that package's kernels.

    Raises:
        ValueError: bad shape, dtype, device, plan, workspace or mode (a det plan or
            workspace), before any launch; the caller's tensors are not modified.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).

    Example::

        import torch
        from cake_dense_projection_nondet_gemm import dense_projection_nondet
        x = torch.randn(4, 16, requires_grad=True)  # CPU: Triton's interpreter
        dense_projection_nondet(x, torch.randn(8, 16)).sum().backward()
    """
    _, plan, (partials, bias_partials) = _nondet_checks(x, weight, bias, plan, workspace,
                                                        main_grad)
    if not torch.compiler.is_compiling():
        return _DenseProjectionNondetFunction.apply(x, weight, bias, plan, partials,
                                                    bias_partials, main_grad)
    return torch.ops.cake_dense_projection_nondet_gemm.fwd(
        x, weight, bias, plan_to_op_fields(plan), partials, bias_partials, main_grad)


def dense_projection_nondet_fwd(x: torch.Tensor, weight: torch.Tensor,
                                bias: torch.Tensor | None = None, *,
                                plan: DenseProjectionNondetPlan | None = None):
    """Low-level forward without autograd: ``(y, saved)``, ``saved`` a
    :class:`DenseProjectionNondetSavedSet` for :func:`dense_projection_nondet_bwd`.
    Arguments, shapes and errors as :func:`dense_projection_nondet`."""
    _, plan, _ = _nondet_checks(x, weight, bias, plan, None, None)
    with torch.no_grad():
        y = _launch_fwd(x, weight, bias, plan)
    saved = DenseProjectionNondetSavedSet(Mode.NONDET, {"x": x, "weight": weight},
                                          meta={"has_bias": bias is not None, "plan": plan})
    return y, saved


def dense_projection_nondet_bwd(dy: torch.Tensor, saved: DenseProjectionNondetSavedSet, *,
                                plan: DenseProjectionNondetPlan | None = None,
                                workspace: DenseProjectionNondetWorkspace | None = None,
                                main_grad: torch.Tensor | None = None
                                ) -> DenseProjectionNondetGrads:
    """Low-level backward: :class:`DenseProjectionNondetGrads` ``(dx, dweight, dbias)``
    from ``dy`` ``[..., N]`` (x's leading dims and dtype) and the saved set of
    :func:`dense_projection_nondet_fwd`; ``plan`` defaults to the forward's, workspace and
    main_grad as in :func:`dense_projection_nondet`.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode (e.g.
            cake_dense_projection_det_gemm's), shape / dtype / device mismatches; before
            any launch.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, before any launch
            (``warn_only=True``: one warning, then it runs).
    """
    require_mode(saved, DenseProjectionNondetSavedSet, Mode.NONDET, name="saved")
    x, weight = saved.tensors()
    N, K = weight.shape
    check_tensor(dy, "dy")
    check_shape(dy, "dy", [*x.shape[:-1], N], layout="[..., N]: like the output, x's leading dims")
    check_dtype(dy, "dy", (x.dtype,))
    _check_main_grad(main_grad, N, K)
    device = check_same_device(("saved", x), ("dy", dy), ("main_grad", main_grad))
    launch_device_check(device, "dy")
    plan = _plan(plan if plan is not None else saved.plan, x.numel() // K, N, K, x.dtype,
                 device)
    partials, bias_partials = _workspace(workspace, plan, device)
    _alert()
    with torch.no_grad():
        dx, dw, db = _launch_bwd_nondet(dy, x, weight, plan, partials, bias_partials,
                                        main_grad, True, True, saved.has_bias)
    return DenseProjectionNondetGrads(dx, dw if main_grad is None else None,
                                      db if saved.has_bias else None)
