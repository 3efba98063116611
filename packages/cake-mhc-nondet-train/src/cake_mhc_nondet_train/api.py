"""Autograd entry (custom ops inside two autograd Functions) of nondet mHC.

The math (DeepSeek, "mHC: Manifold-Constrained Hyper-Connections", arXiv:2512.24880), the
checks and the launches are cake-mhc-det-train's (:mod:`cake_mhc_det_train.api`): this
module runs that package's kernels with an :class:`MHCNondetPlan`, under its own custom ops
(``cake_mhc_nondet_train::prepare_fwd`` / ``prepare_bwd`` / ``finish_fwd`` /
``finish_bwd``), eager and under ``torch.compile`` as the det package. Its bits are not
promised. Under ``torch.use_deterministic_algorithms(True)`` the backward raises
``RuntimeError`` before any launch (with ``warn_only=True`` it warns once and runs); use
``cake_mhc_det_train.mhc_det_prepare`` / ``mhc_det_finish`` for repeatable gradients.
"""

from __future__ import annotations

import torch
from cake_core import (
    Mode,
    nondet_alert,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import custom_op, op_or_body, plan_from_op_fields, plan_to_op_fields
from cake_mhc_det_train.api import (
    _check_finish,
    _checks,
    _launch_finish_bwd,
    _launch_finish_fwd,
    _launch_prepare_bwd,
    _launch_prepare_fwd,
    _recheck_workspace,
)
from cake_mhc_det_train.plan import n_coeffs

from cake_mhc_nondet_train.plan import MHCNondetPlan, make_nondet_plan
from cake_mhc_nondet_train.saved import MHCNondetSavedSet, MHCNondetWorkspace

_OP = "cake_mhc_nondet_train"


def _alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_mhc_nondet_train's backward",
                 "cake_mhc_det_train.mhc_det_prepare / mhc_det_finish")


def _eager_alert() -> None:
    # eager: before the backward launches anything; traced by torch.compile, the ops'
    # own alert runs at run time instead
    if not torch.compiler.is_compiling():
        _alert()


def _nondet_checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace, *,
                   launch: bool = True):
    """The det prepare's checks with this package's plan, rule and workspace classes (also
    :func:`is_supported_nondet`'s) -> ``(device, plan, dphi_partials)``."""
    return _checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace,
                   plan_cls=MHCNondetPlan, rule=make_nondet_plan, ws_cls=MHCNondetWorkspace,
                   launch=launch)


def _recheck(check) -> None:
    _recheck_workspace(check, ws_cls=MHCNondetWorkspace, entry="mhc_nondet_prepare")


def _plan(plan_fields) -> MHCNondetPlan:
    return plan_from_op_fields(MHCNondetPlan, plan_fields, Mode.NONDET)


# ----------------------------------------------------------------------------- custom ops


@custom_op(f"{_OP}::prepare_fwd", mutates_args=())
def _prepare_fwd_op(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor, eps: float, sinkhorn_iters: int,
                    plan_fields: list[int],
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_prepare_fwd(X, phi, alpha, bias, eps, sinkhorn_iters, _plan(plan_fields))


@_prepare_fwd_op.register_fake
def _prepare_fwd_fake(X, phi, alpha, bias, eps, sinkhorn_iters, plan_fields):
    T, n, C = X.shape
    M = n_coeffs(n)
    f32 = dict(dtype=torch.float32)
    return (X.new_empty((T, C)), X.new_empty((T, M), **f32), X.new_empty((T, M), **f32),
            X.new_empty((T,), **f32))


@custom_op(f"{_OP}::prepare_bwd", mutates_args=("partials",))
def _prepare_bwd_op(dU: torch.Tensor | None, dcoef: torch.Tensor | None,
                    dX_in: torch.Tensor | None, X: torch.Tensor, phi: torch.Tensor,
                    alpha: torch.Tensor, bias: torch.Tensor, mix: torch.Tensor,
                    rstd: torch.Tensor, coef: torch.Tensor, sinkhorn_iters: int,
                    plan_fields: list[int], partials: torch.Tensor | None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _alert()
    dX, dphi, dalpha, dbias = _launch_prepare_bwd(dU, dcoef, dX_in, X, phi, alpha, bias, mix,
                                                  rstd, coef, sinkhorn_iters,
                                                  _plan(plan_fields), partials)
    return dX, dphi, dalpha.clone(), dbias.clone()


@_prepare_bwd_op.register_fake
def _prepare_bwd_fake(dU, dcoef, dX_in, X, phi, alpha, bias, mix, rstd, coef, sinkhorn_iters,
                      plan_fields, partials):
    return X.new_empty(X.shape), phi.new_empty(phi.shape), alpha.new_empty((3,)), \
        bias.new_empty(bias.shape)


@custom_op(f"{_OP}::finish_fwd", mutates_args=())
def _finish_fwd_op(X: torch.Tensor, B: torch.Tensor, coef: torch.Tensor,
                   plan_fields: list[int]) -> torch.Tensor:
    return _launch_finish_fwd(X, B, coef, _plan(plan_fields))


@_finish_fwd_op.register_fake
def _finish_fwd_fake(X, B, coef, plan_fields):
    return X.new_empty(X.shape)


@custom_op(f"{_OP}::finish_bwd", mutates_args=())
def _finish_bwd_op(dY: torch.Tensor, X: torch.Tensor, B: torch.Tensor, coef: torch.Tensor,
                   plan_fields: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _alert()
    return _launch_finish_bwd(dY, X, B, coef, _plan(plan_fields))


@_finish_bwd_op.register_fake
def _finish_bwd_fake(dY, X, B, coef, plan_fields):
    return X.new_empty(X.shape), B.new_empty(B.shape), coef.new_empty(coef.shape)


# ----------------------------------------------------------------------------- autograd


class _PrepareFunction(torch.autograd.Function):
    """prepare's autograd node: cake-mhc-det-train's ``_PrepareFunction`` on this package's
    ops (the X view through which the finish's part of dX meets the prepare's in one
    kernel; the workspace on ctx, checked again before the backward launches)."""

    @staticmethod
    def forward(ctx, X, phi, alpha, bias, eps, iters, plan_fields, partials, ws_check):
        U, coef, mix, rstd = op_or_body(f"{_OP}::prepare_fwd")(
            X, phi, alpha, bias, eps, iters, plan_fields)
        ctx.iters, ctx.plan_fields, ctx.partials = iters, plan_fields, partials
        ctx.ws_check = ws_check
        ctx.save_for_backward(X, phi, alpha, bias, mix, rstd, coef)
        ctx.mark_non_differentiable(mix, rstd)
        ctx.set_materialize_grads(False)
        return U, coef, mix, rstd, X.view_as(X)

    @staticmethod
    @once_differentiable
    def backward(ctx, dU, dcoef, dmix, drstd, dX_view):
        _eager_alert()
        _recheck(ctx.ws_check)
        X, phi, alpha, bias, mix, rstd, coef = ctx.saved_tensors
        dX, dphi, dalpha, dbias = op_or_body(f"{_OP}::prepare_bwd")(
            dU, dcoef, dX_view, X, phi, alpha, bias, mix, rstd, coef, ctx.iters,
            ctx.plan_fields, ctx.partials)
        need = ctx.needs_input_grad
        return (dX if need[0] else None, dphi if need[1] else None,
                dalpha if need[2] else None, dbias if need[3] else None, None, None, None,
                None, None)


class _FinishFunction(torch.autograd.Function):
    """finish's autograd node: dY -> (dX part H_res^T dY, dB, d(H_post, H_res)), on this
    package's ops; the prepare's workspace checked again here too."""

    @staticmethod
    def forward(ctx, X, B, coef, plan_fields, ws_check):
        ctx.plan_fields, ctx.ws_check = plan_fields, ws_check
        ctx.save_for_backward(X, B, coef)
        return op_or_body(f"{_OP}::finish_fwd")(X, B, coef, plan_fields)

    @staticmethod
    @once_differentiable
    def backward(ctx, dY):
        _eager_alert()
        _recheck(ctx.ws_check)
        X, B, coef = ctx.saved_tensors
        dX, dB, dcoef = op_or_body(f"{_OP}::finish_bwd")(dY, X, B, coef,
                                                                   ctx.plan_fields)
        need = ctx.needs_input_grad
        return (dX if need[0] else None, dB if need[1] else None,
                dcoef if need[2] else None, None, None)


# ----------------------------------------------------------------------------- public API


def mhc_nondet_prepare(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                       bias: torch.Tensor, *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                       plan: MHCNondetPlan | None = None,
                       workspace: MHCNondetWorkspace | None = None,
                       ) -> tuple[torch.Tensor, MHCNondetSavedSet]:
    """First half of an mHC layer, bits not promised: the coefficients (H_pre, H_post,
    Sinkhorn H_res) and the branch input ``U = sum_i H_pre[i] X[i]``.

    Arguments (X ``[T, n, C]`` or ``[B, S, n, C]`` fp32 / bf16, phi ``[n*C, 2n + n^2]``,
    alpha ``[3]``, bias ``[2n + n^2]``, eps, sinkhorn_iters), math, shapes, dtypes and
    errors are those of ``cake_mhc_det_train.mhc_det_prepare``, with an
    :class:`MHCNondetPlan` (default: :func:`make_nondet_plan`) and an
    :class:`MHCNondetWorkspace`. It runs that package's kernels today.

    Returns:
        ``(U, handle)``: U ``[..., C]`` in X's dtype; ``handle`` an
        :class:`MHCNondetSavedSet` for :func:`mhc_nondet_finish`.

    Raises:
        ValueError: bad shape, dtype, device, stride, eps, sinkhorn_iters, plan, workspace
            or mode (a det plan or workspace), before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).
    """
    device, plan, parts = _nondet_checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan,
                                         workspace)
    n, C = X.shape[-2], X.shape[-1]
    lead = tuple(X.shape[:-2])
    X3 = X.reshape(-1, n, C)
    ws_check = None if workspace is None or torch.compiler.is_compiling() else \
        (workspace, plan, device)
    U, coef, mix, rstd, x_view = _PrepareFunction.apply(
        X3, phi, alpha, bias, float(eps), int(sinkhorn_iters), plan_to_op_fields(plan), parts,
        ws_check)
    handle = MHCNondetSavedSet(
        Mode.NONDET, {"coef": coef, "mix": mix, "rstd": rstd, "x_view": x_view},
        meta={"plan": plan, "x_shape": tuple(X.shape), "x_dtype": X.dtype, "eps": float(eps),
              "sinkhorn_iters": int(sinkhorn_iters), "x_input": X, "ws_check": ws_check})
    return U.reshape(*lead, C), handle


def mhc_nondet_finish(X: torch.Tensor, B: torch.Tensor,
                      handle: MHCNondetSavedSet) -> torch.Tensor:
    """Second half of an mHC layer, bits not promised: ``Y[j] = H_post[j] * B +
    sum_i H_res[j, i] * X[i]`` per token, with the coefficients of ``handle``.

    Arguments (X: the tensor given to :func:`mhc_nondet_prepare`; B: the branch output
    ``[..., C]``, X's dtype), math and errors are those of
    ``cake_mhc_det_train.mhc_det_finish``. Returns Y like X.

    Raises:
        ValueError: a handle of another type or mode (e.g. cake_mhc_det_train's),
            shape / dtype / device mismatches, before any launch.
        RuntimeError: in the backward under ``torch.use_deterministic_algorithms(True)``,
            before any launch (``warn_only=True``: one warning, then it runs).
    """
    require_mode(handle, MHCNondetSavedSet, Mode.NONDET, name="handle")
    meta, coef, x_view = _check_finish(X, B, handle)
    n, C = X.shape[-2], X.shape[-1]
    X3 = x_view if X is meta["x_input"] else X.reshape(-1, n, C)
    Y = _FinishFunction.apply(X3, B.reshape(-1, C), coef, plan_to_op_fields(meta["plan"]),
                              meta.get("ws_check"))
    return Y.reshape(X.shape)
