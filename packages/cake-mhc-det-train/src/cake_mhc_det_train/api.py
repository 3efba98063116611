"""Autograd entry (custom ops inside two autograd Functions) and the launches of det mHC.

Math (DeepSeek, "mHC: Manifold-Constrained Hyper-Connections", arXiv:2512.24880, 2025),
per token with X ``[n, C]`` (n streams of width C), x = vec(X) ``[n*C]`` stream-major
(x[i*C + c] = X[i, c]), M = 2n + n^2:

    rstd = 1 / sqrt(mean(x^2) + eps);  mix = rstd * (x @ phi)            ``[M]``
    h_pre  = alpha[0] * mix[0:n]   + bias[0:n]        H_pre  = sigmoid(h_pre)        ``[n]``
    h_post = alpha[1] * mix[n:2n]  + bias[n:2n]       H_post = 2 * sigmoid(h_post)   ``[n]``
    h_res  = alpha[2] * mix[2n:]   + bias[2n:]        H_res  = Sinkhorn(exp(h_res))  ``[n, n]``
    U = sum_i H_pre[i] X[i]                    (the branch input, ``[C]``)
    Y[j] = H_post[j] * B + sum_i H_res[j, i] X[i]   (B = F(U), the branch output)

h_res is row major ``[n, n]``: row j = output stream, column i = input stream, so
Y = H_res X + H_post^T B as in the paper's x_{l+1} = H_res x_l + H_post^T F(H_pre x_l)
(the same layout as Liger-Kernel's mHC: phi ``[n*C, 2n + n^2]``, columns pre | post | res).
Sinkhorn: ``sinkhorn_iters`` iterations of (divide every row by its sum, then every column
by its sum), computed in the log domain (kernels/common.py). Backward differentiates
through every iteration. The gradient of phi, bias and alpha are sums over all tokens:
fp32 partials per program / token slice, summed in a fixed order (no atomics). dX has two
parts (the finish's H_res^T dY and the prepare's); with the same X in both calls they meet
inside the dX kernel (see _PrepareFunction).

torch.compile: the Functions are traced by dynamo (fullgraph) around the custom ops, whose
fake implementations give the shapes; eager and compiled runs launch the same kernels.
"""

from __future__ import annotations

import torch
from cake_core import (
    Mode,
    check_dtype,
    check_int,
    check_last_dim_contiguous,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import custom_op, op_or_body, plan_from_op_fields, plan_to_op_fields
from cake_core.triton_utils import cdiv, launch_device_check, next_power_of_2

from cake_mhc_det_train.kernels.bwd import (
    mhc_bwd_coef_kernel,
    mhc_bwd_dx_kernel,
    rows_sum_kernel,
)
from cake_mhc_det_train.kernels.finish import mhc_finish_bwd_kernel, mhc_finish_fwd_kernel
from cake_mhc_det_train.kernels.fwd import mhc_coef_kernel, mhc_mix_kernel
from cake_mhc_det_train.plan import MAX_HIDDEN, N_STREAMS, MHCDetPlan, make_plan, n_coeffs
from cake_mhc_det_train.saved import MHCDetSavedSet, MHCDetWorkspace

_X_DTYPES = (torch.float32, torch.bfloat16)
#: Largest ``sinkhorn_iters`` accepted.
MAX_SINKHORN_ITERS = 100

# Every buffer the launches hand to a kernel comes from here (tests swap in a NaN-filling
# allocator to prove each element is written).
_empty = torch.empty


# ----------------------------------------------------------------------------- checks


def _check_prepare(X, phi, alpha, bias, eps, sinkhorn_iters, *, launch: bool = True):
    check_tensor(X, "X")
    if X.dim() not in (3, 4):
        raise ValueError(f"X: expected a 3-D [T, n, C] or 4-D [B, S, n, C] tensor, got "
                         f"{X.dim()}-D {tuple(X.shape)}")
    check_dtype(X, "X", _X_DTYPES)
    n, C = X.shape[-2], X.shape[-1]
    if n not in N_STREAMS:
        raise ValueError(f"X: the stream dimension (dim -2) must be one of {N_STREAMS}, got {n}")
    if not 1 <= C <= MAX_HIDDEN:
        raise ValueError(f"X: the last dimension (C) must be in [1, {MAX_HIDDEN}], got {C}")
    check_last_dim_contiguous(X, "X")
    M = n_coeffs(n)
    check_tensor(phi, "phi")
    check_shape(phi, "phi", [n * C, M],
                layout="[n * C, n^2 + 2n]: X's flattened streams by columns pre | post | res")
    check_dtype(phi, "phi", (torch.float32,))
    if not phi.is_contiguous():
        raise ValueError("phi: must be contiguous")
    check_tensor(alpha, "alpha")
    check_shape(alpha, "alpha", [3])
    check_dtype(alpha, "alpha", (torch.float32,))
    check_last_dim_contiguous(alpha, "alpha")
    check_tensor(bias, "bias")
    check_shape(bias, "bias", [M], layout="[n^2 + 2n]: one per column of phi")
    check_dtype(bias, "bias", (torch.float32,))
    check_last_dim_contiguous(bias, "bias")
    check_positive_finite(eps, "eps")
    check_int(sinkhorn_iters, "sinkhorn_iters", 1, MAX_SINKHORN_ITERS)
    device = check_same_device(("X", X), ("phi", phi), ("alpha", alpha), ("bias", bias))
    if launch:  # off for the size queries, which serve meta tensors
        launch_device_check(device, "X")
    return device


def _resolve_plan(plan, n: int, C: int, dtype, device, *, plan_cls=MHCDetPlan,
                  rule=None) -> MHCDetPlan:
    """``plan``, or ``rule``'s, checked: a ``plan_cls`` of its mode for (n, C)
    (``plan_cls`` / ``rule``, default :func:`make_plan`: the nondet sibling passes its own)."""
    if plan is None:
        return (rule or make_plan)(n, C, dtype, device)
    require_mode(plan, plan_cls, plan_cls.expected_mode, name="plan")
    if plan.n_streams != n or plan.hidden_size != C:
        raise ValueError(f"plan: made for n_streams={plan.n_streams}, hidden_size="
                         f"{plan.hidden_size}; inputs have n={n}, C={C}")
    return plan


def _resolve_workspace(workspace, plan: MHCDetPlan, device, *, ws_cls=MHCDetWorkspace):
    """The workspace's ``dphi_partials``, checked: a ``ws_cls`` of the plan's mode made for
    ``plan`` on ``device`` (``ws_cls``: the nondet sibling passes its own)."""
    if workspace is None:
        return None
    require_mode(workspace, ws_cls, type(plan).expected_mode, name="workspace")
    workspace.check(plan, device)
    parts = workspace["dphi_partials"]
    want = (plan.dphi_slices, plan.n_streams * plan.hidden_size, plan.n_coeffs)
    if tuple(parts.shape) != want or parts.dtype != torch.float32 or not parts.is_contiguous():
        raise ValueError(
            f"workspace: 'dphi_partials' must be a contiguous fp32 tensor of shape {list(want)},"
            f" got {str(parts.dtype)[6:]} {list(parts.shape)}; build it with "
            f"{ws_cls.__name__}.for_plan(plan, device)")
    return parts


def _checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace, *, plan_cls=MHCDetPlan,
            rule=None, ws_cls=MHCDetWorkspace, launch: bool = True):
    """Every check the prepare makes before a launch (also :func:`is_supported`'s) ->
    ``(device, plan, dphi_partials)``. ``plan_cls`` / ``rule`` / ``ws_cls``: the nondet
    sibling's; ``launch=False`` skips the backend's device check (size queries)."""
    device = _check_prepare(X, phi, alpha, bias, eps, sinkhorn_iters, launch=launch)
    n, C = X.shape[-2], X.shape[-1]
    plan = _resolve_plan(plan, n, C, X.dtype, device, plan_cls=plan_cls, rule=rule)
    return device, plan, _resolve_workspace(workspace, plan, device, ws_cls=ws_cls)


def _recheck_workspace(check, *, ws_cls=MHCDetWorkspace, entry="mhc_det_prepare") -> None:
    """The backward's check of the workspace :func:`mhc_det_prepare` was given: the same
    checks again (type, mode, plan key, device, buffer), so a workspace whose mode, plan or
    device changed between the forward and the backward is refused before the backward
    launches anything. ``check``: ``None`` (no workspace, or traced by ``torch.compile``)
    or ``(workspace, plan, device)``. ``ws_cls`` / ``entry``: the nondet sibling's.

    Raises:
        ValueError: ``workspace: ...`` as in the forward, plus where it was caught.
    """
    if check is None:
        return
    workspace, plan, device = check
    try:
        _resolve_workspace(workspace, plan, device, ws_cls=ws_cls)
    except ValueError as e:
        raise ValueError(f"{e} (checked again in the backward: the workspace given to "
                         f"{entry} changed after the forward)") from None


# ----------------------------------------------------------------------------- launches


def _lastc(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _launch_prepare_fwd(X, phi, alpha, bias, eps: float, iters: int, plan: MHCDetPlan):
    """X ``[T, n, C]`` (last dim contiguous) -> (U ``[T, C]``, coef, mix ``[T, M]``, rstd)."""
    T, n, C = X.shape
    M = n_coeffs(n)
    dev = X.device
    U = _empty((T, C), dtype=X.dtype, device=dev)
    coef = _empty((T, M), dtype=torch.float32, device=dev)
    mix = _empty((T, M), dtype=torch.float32, device=dev)
    rstd = _empty((T,), dtype=torch.float32, device=dev)
    if T == 0:
        return U, coef, mix, rstd
    mhc_mix_kernel[(cdiv(T, plan.mix_block_t),)](
        X, phi, mix, rstd, T, C, X.stride(0), X.stride(1), eps,
        N=n, M=M, BLOCK_M=plan.block_m, BLOCK_T=plan.mix_block_t, BLOCK_C=plan.mix_block_c,
        PREC=plan.dot_precision, num_warps=plan.mix_warps)
    mhc_coef_kernel[(cdiv(T, plan.coef_block_t),)](
        X, mix, alpha, bias, coef, U, T, C, X.stride(0), X.stride(1), U.stride(0),
        N=n, M=M, ITERS=iters, BLOCK_T=plan.coef_block_t, BLOCK_C=plan.coef_block_c,
        num_warps=plan.coef_warps)
    return U, coef, mix, rstd


def _launch_finish_fwd(X, B, coef, plan: MHCDetPlan):
    T, n, C = X.shape
    Y = _empty((T, n, C), dtype=X.dtype, device=X.device)
    if T == 0:
        return Y
    B = _lastc(B)
    grid = (cdiv(T, plan.fin_block_t), cdiv(C, plan.fin_block_c))
    mhc_finish_fwd_kernel[grid](
        X, B, coef, Y, T, C, X.stride(0), X.stride(1), B.stride(0), Y.stride(0), Y.stride(1),
        N=n, M=n_coeffs(n), BLOCK_T=plan.fin_block_t, BLOCK_C=plan.fin_block_c,
        num_warps=plan.fin_warps)
    return Y


def _launch_finish_bwd(dY, X, B, coef, plan: MHCDetPlan):
    """-> (dX ``[T, n, C]`` like X, dB ``[T, C]`` like B, dcoef ``[T, M]`` fp32)."""
    T, n, C = X.shape
    M = n_coeffs(n)
    dev = X.device
    dX = _empty((T, n, C), dtype=X.dtype, device=dev)
    dB = _empty((T, C), dtype=B.dtype, device=dev)
    dcoef = _empty((T, M), dtype=torch.float32, device=dev)
    if T == 0:
        return dX, dB, dcoef
    dY, B = _lastc(dY), _lastc(B)
    mhc_finish_bwd_kernel[(cdiv(T, plan.fin_block_t),)](
        dY, X, B, coef, dX, dB, dcoef, T, C, dY.stride(0), dY.stride(1), X.stride(0),
        X.stride(1), B.stride(0), dX.stride(0), dX.stride(1), dB.stride(0),
        N=n, M=M, BLOCK_T=plan.fin_block_t, BLOCK_C=plan.fin_block_c,
        num_warps=plan.fin_warps)
    return dX, dB, dcoef


def _rows_sum(parts: torch.Tensor, out: torch.Tensor, plan: MHCDetPlan) -> None:
    """out (fp32, contiguous) = parts.reshape(R, -1).sum(0) in the fixed order."""
    R = parts.shape[0]
    W = out.numel()
    rows_sum_kernel[(cdiv(W, plan.reduce_block_w),)](
        parts, out, R, W, BLOCK_R=plan.reduce_block_r, BLOCK_W=plan.reduce_block_w,
        num_warps=4)


def _launch_prepare_bwd(dU, dcoef, dX_in, X, phi, alpha, bias, mix, rstd, coef, iters: int,
                        plan: MHCDetPlan, parts):
    """-> (dX like X, dphi ``[n*C, M]``, dalpha ``[3]``, dbias ``[M]``, all fp32 but dX).

    ``dU``: ``[T, C]`` or None (zero); ``dcoef``: ``[T, M]`` or None (zero); ``dX_in``:
    ``[T, n, C]`` added into dX, or None."""
    T, n, C = X.shape
    M = n_coeffs(n)
    dev = X.device
    dX = _empty((T, n, C), dtype=X.dtype, device=dev)
    dphi = _empty((n * C, M), dtype=torch.float32, device=dev)
    red = _empty((M + 3,), dtype=torch.float32, device=dev)
    if T == 0:
        dphi.zero_()
        red.zero_()
        return dX, dphi, red[M:], red[:M]
    if dU is None:
        dU = torch.zeros((T, C), dtype=X.dtype, device=dev)
    dU = _lastc(dU)
    if dX_in is not None:
        dX_in = _lastc(dX_in)
    dz = _empty((T, M), dtype=torch.float32, device=dev)
    cx = _empty((T,), dtype=torch.float32, device=dev)
    n_blk = cdiv(T, plan.coef_block_t)
    pb = _empty((n_blk, M + 3), dtype=torch.float32, device=dev)
    mhc_bwd_coef_kernel[(n_blk,)](
        X, dU, mix, rstd, alpha, bias, dcoef if dcoef is not None else mix, dz, cx, pb,
        T, C, X.stride(0), X.stride(1), dU.stride(0),
        N=n, M=M, ITERS=iters, IP=next_power_of_2(iters + 1), BLOCK_T=plan.coef_block_t,
        BLOCK_C=plan.coef_block_c, HAS_DCOEF=dcoef is not None, num_warps=plan.coef_warps)
    S = plan.dphi_slices
    if parts is None:
        parts = _empty((S, n * C, M), dtype=torch.float32, device=dev)
    d_in = dX_in if dX_in is not None else X
    grid = (n * cdiv(C, plan.dx_block_c), S)
    mhc_bwd_dx_kernel[grid](
        X, dU, d_in, coef, dz, cx, phi, dX, parts,
        T, C, S, X.stride(0), X.stride(1), dU.stride(0), d_in.stride(0), d_in.stride(1),
        dX.stride(0), dX.stride(1),
        N=n, M=M, BLOCK_M=plan.block_m, BLOCK_T=plan.dx_block_t, BLOCK_C=plan.dx_block_c,
        PREC=plan.dot_precision, HAS_DX_IN=dX_in is not None, num_warps=plan.dx_warps)
    _rows_sum(parts, dphi, plan)
    _rows_sum(pb, red, plan)
    return dX, dphi, red[M:], red[:M]


# ----------------------------------------------------------------------------- custom ops


@custom_op("cake_mhc_det_train::prepare_fwd", mutates_args=())
def _prepare_fwd_op(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor, eps: float, sinkhorn_iters: int,
                    plan_fields: list[int],
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = plan_from_op_fields(MHCDetPlan, plan_fields)
    return _launch_prepare_fwd(X, phi, alpha, bias, eps, sinkhorn_iters, plan)


@_prepare_fwd_op.register_fake
def _prepare_fwd_fake(X, phi, alpha, bias, eps, sinkhorn_iters, plan_fields):
    T, n, C = X.shape
    M = n_coeffs(n)
    f32 = dict(dtype=torch.float32)
    return (X.new_empty((T, C)), X.new_empty((T, M), **f32), X.new_empty((T, M), **f32),
            X.new_empty((T,), **f32))


@custom_op("cake_mhc_det_train::prepare_bwd", mutates_args=("partials",))
def _prepare_bwd_op(dU: torch.Tensor | None, dcoef: torch.Tensor | None,
                    dX_in: torch.Tensor | None, X: torch.Tensor, phi: torch.Tensor,
                    alpha: torch.Tensor, bias: torch.Tensor, mix: torch.Tensor,
                    rstd: torch.Tensor, coef: torch.Tensor, sinkhorn_iters: int,
                    plan_fields: list[int], partials: torch.Tensor | None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = plan_from_op_fields(MHCDetPlan, plan_fields)
    dX, dphi, dalpha, dbias = _launch_prepare_bwd(dU, dcoef, dX_in, X, phi, alpha, bias, mix,
                                                  rstd, coef, sinkhorn_iters, plan, partials)
    return dX, dphi, dalpha.clone(), dbias.clone()


@_prepare_bwd_op.register_fake
def _prepare_bwd_fake(dU, dcoef, dX_in, X, phi, alpha, bias, mix, rstd, coef, sinkhorn_iters,
                      plan_fields, partials):
    return X.new_empty(X.shape), phi.new_empty(phi.shape), alpha.new_empty((3,)), \
        bias.new_empty(bias.shape)


@custom_op("cake_mhc_det_train::finish_fwd", mutates_args=())
def _finish_fwd_op(X: torch.Tensor, B: torch.Tensor, coef: torch.Tensor,
                   plan_fields: list[int]) -> torch.Tensor:
    return _launch_finish_fwd(X, B, coef, plan_from_op_fields(MHCDetPlan, plan_fields))


@_finish_fwd_op.register_fake
def _finish_fwd_fake(X, B, coef, plan_fields):
    return X.new_empty(X.shape)


@custom_op("cake_mhc_det_train::finish_bwd", mutates_args=())
def _finish_bwd_op(dY: torch.Tensor, X: torch.Tensor, B: torch.Tensor, coef: torch.Tensor,
                   plan_fields: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_finish_bwd(dY, X, B, coef, plan_from_op_fields(MHCDetPlan, plan_fields))


@_finish_bwd_op.register_fake
def _finish_bwd_fake(dY, X, B, coef, plan_fields):
    return X.new_empty(X.shape), B.new_empty(B.shape), coef.new_empty(coef.shape)


# ----------------------------------------------------------------------------- autograd


class _PrepareFunction(torch.autograd.Function):
    """prepare's autograd node (eager and, traced by dynamo, ``torch.compile``: the same ops,
    the same bits). Besides U and the coefficients it returns ``X.view_as(X)``: when the
    finish is called with the same X, it computes with this view, so the finish's part of
    dX arrives here as the gradient of the view and the dX kernel adds it in fp32 (one
    rounding, no separate elementwise add by autograd). The workspace buffer stays on ctx
    (not a saved tensor), so one workspace may serve several calls before their backwards.
    ``ws_check`` (eager only, see :func:`_recheck_workspace`): the workspace, checked again
    before the backward launches.
    """

    @staticmethod
    def forward(ctx, X, phi, alpha, bias, eps, iters, plan_fields, partials, ws_check):
        U, coef, mix, rstd = op_or_body("cake_mhc_det_train::prepare_fwd")(
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
        _recheck_workspace(ctx.ws_check)
        X, phi, alpha, bias, mix, rstd, coef = ctx.saved_tensors
        dX, dphi, dalpha, dbias = op_or_body("cake_mhc_det_train::prepare_bwd")(
            dU, dcoef, dX_view, X, phi, alpha, bias, mix, rstd, coef, ctx.iters,
            ctx.plan_fields, ctx.partials)
        need = ctx.needs_input_grad
        return (dX if need[0] else None, dphi if need[1] else None,
                dalpha if need[2] else None, dbias if need[3] else None, None, None, None,
                None, None)


class _FinishFunction(torch.autograd.Function):
    """finish's autograd node: dY -> (dX part H_res^T dY, dB, d(H_post, H_res)).

    ``ws_check``: the prepare's workspace (eager only), checked again here too: this node's
    backward runs first, so a changed workspace is refused before the layer's backward
    launches anything (or the branch's backward runs)."""

    @staticmethod
    def forward(ctx, X, B, coef, plan_fields, ws_check):
        ctx.plan_fields, ctx.ws_check = plan_fields, ws_check
        ctx.save_for_backward(X, B, coef)
        return op_or_body("cake_mhc_det_train::finish_fwd")(X, B, coef, plan_fields)

    @staticmethod
    @once_differentiable
    def backward(ctx, dY):
        _recheck_workspace(ctx.ws_check)
        X, B, coef = ctx.saved_tensors
        dX, dB, dcoef = op_or_body("cake_mhc_det_train::finish_bwd")(dY, X, B, coef,
                                                                ctx.plan_fields)
        need = ctx.needs_input_grad
        return (dX if need[0] else None, dB if need[1] else None,
                dcoef if need[2] else None, None, None)


# ----------------------------------------------------------------------------- public API


def mhc_det_prepare(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor, *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                    plan: MHCDetPlan | None = None,
                    workspace: MHCDetWorkspace | None = None,
                    ) -> tuple[torch.Tensor, MHCDetSavedSet]:
    """First half of a deterministic mHC layer: the coefficients and the branch input U.

    Per token (X ``[n, C]``, x = vec(X) stream-major, M = 2n + n^2)::

        mix = (x @ phi) / sqrt(mean(x^2) + eps)
        H_pre  = sigmoid(alpha[0] * mix[:n] + bias[:n])
        H_post = 2 * sigmoid(alpha[1] * mix[n:2n] + bias[n:2n])
        H_res  = Sinkhorn(exp(alpha[2] * mix[2n:] + bias[2n:]).reshape(n, n))
        U = sum_i H_pre[i] * X[i]

    (DeepSeek mHC, arXiv:2512.24880; layouts as Liger-Kernel's ``LigerMHC``, whose three
    scalar alphas are ``alpha[0]``, ``alpha[1]``, ``alpha[2]`` here.) Sinkhorn runs
    ``sinkhorn_iters`` iterations of (rows / row sums, then columns / column sums), so the
    columns of H_res sum to 1 up to rounding and its rows approximately; row j is output
    stream j, column i input stream i.

    Args:
        X: ``[T, n, C]`` or ``[B, S, n, C]``, fp32 or bf16, last dim contiguous; n in
            (2, 4, 8), 1 <= C <= 65536.
        phi: ``[n*C, 2n + n^2]`` fp32, contiguous; row i*C + c multiplies X[i, c]; columns
            pre (n) | post (n) | res (n*n, row major [j, i]).
        alpha: ``[3]`` fp32 (pre, post, res scales). bias: ``[2n + n^2]`` fp32.
        eps: > 0, added to the mean square. sinkhorn_iters: int in [1, 100].
        plan: an :class:`MHCDetPlan` for (n, C) (default ``make_plan(n, C, X.dtype, dev)``).
            Plans are dtype-agnostic: one plan serves fp32 and bf16 X alike (the kernels
            compute in fp32 and store in X's dtype), so a plan made with another dtype is
            accepted; a plan for another n or C is refused.
        workspace: an :class:`MHCDetWorkspace` for that plan (default: allocated per
            backward). Checked here and, in eager mode, again when the backward starts
            (type, mode, plan key, device, buffer): a workspace changed in between is
            refused with ``ValueError`` before the backward launches anything.

    Returns:
        ``(U, handle)``: U ``[T, C]`` / ``[B, S, C]`` in X's dtype; ``handle`` an
        :class:`MHCDetSavedSet` for :func:`mhc_det_finish`. The coefficients are computed
        and kept in fp32.

    Gradients (autograd, through both calls): X, phi, alpha, bias (and B in the finish).
    Not twice differentiable, like every cake family (the backwards are
    ``once_differentiable``): a backward with ``create_graph=True`` runs, but
    differentiating its gradients again (double backward, e.g. a gradient penalty) raises
    ``RuntimeError`` ("trying to differentiate twice a function that was marked with
    @once_differentiable"); it never returns silently wrong second derivatives.
    Determinism: every gradient is bitwise repeatable for equal inputs, plan and hardware
    (fixed-order partial sums for phi, alpha and bias; no atomics).

    Raises:
        ValueError: bad shape, dtype, device, stride, eps, sinkhorn_iters, plan, workspace
            or mode, before any launch; the caller's tensors are not modified.
    """
    device, plan, parts = _checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace)
    n, C = X.shape[-2], X.shape[-1]
    lead = tuple(X.shape[:-2])
    X3 = X.reshape(-1, n, C)
    # eager: the backwards check the workspace again (under torch.compile it is checked
    # here, when the forward is traced)
    ws_check = None if workspace is None or torch.compiler.is_compiling() else \
        (workspace, plan, device)
    U, coef, mix, rstd, x_view = _PrepareFunction.apply(
        X3, phi, alpha, bias, float(eps), int(sinkhorn_iters), plan_to_op_fields(plan), parts,
        ws_check)
    handle = MHCDetSavedSet(
        Mode.DET, {"coef": coef, "mix": mix, "rstd": rstd, "x_view": x_view},
        meta={"plan": plan, "x_shape": tuple(X.shape), "x_dtype": X.dtype, "eps": float(eps),
              "sinkhorn_iters": int(sinkhorn_iters), "x_input": X, "ws_check": ws_check})
    return U.reshape(*lead, C), handle


def mhc_det_finish(X: torch.Tensor, B: torch.Tensor, handle: MHCDetSavedSet) -> torch.Tensor:
    """Second half of a deterministic mHC layer: ``Y[j] = H_post[j] * B + sum_i H_res[j, i]
    * X[i]`` per token, with the coefficients of ``handle``.

    Args:
        X: the tensor given to :func:`mhc_det_prepare` (same shape and dtype; the math uses
            the X passed here).
        B: the branch output F(U), ``[T, C]`` / ``[B, S, C]`` (X's leading dims), X's dtype,
            last dim contiguous.
        handle: the :class:`MHCDetSavedSet` that :func:`mhc_det_prepare` returned.

    Returns:
        Y like X (``[..., n, C]``, X's dtype). Gradients flow to X, B and, through the
        handle's coefficients, to phi, alpha and bias. Not twice differentiable (double
        backward raises ``RuntimeError``, see :func:`mhc_det_prepare`).

    Raises:
        ValueError: a handle of another type or mode, shape/dtype/device mismatches, before
            any launch; in eager mode, the backward raises it too (before launching) when
            the prepare's workspace changed in between.
    """
    require_mode(handle, MHCDetSavedSet, Mode.DET, name="handle")
    meta, coef, x_view = _check_finish(X, B, handle)
    n, C = X.shape[-2], X.shape[-1]
    plan = meta["plan"]
    # the prepare's own X: compute with its view, so dX's two parts meet in one kernel
    X3 = x_view if X is meta["x_input"] else X.reshape(-1, n, C)
    Y = _FinishFunction.apply(X3, B.reshape(-1, C), coef, plan_to_op_fields(plan),
                              meta.get("ws_check"))
    return Y.reshape(X.shape)


def _check_finish(X, B, handle):
    """The finish's checks of X and B against a handle of the right type and mode (the
    nondet sibling's too) -> (meta, coef, x_view)."""
    # the handle's contents by its meta dict and tensors(), not by attribute (the saved
    # set's __getattr__): plain lookups for dynamo, which traces this under torch.compile
    meta = handle.meta
    coef, _, _, x_view = handle.tensors()
    check_tensor(X, "X")
    if tuple(X.shape) != meta["x_shape"]:
        raise ValueError(f"X: expected shape {list(meta['x_shape'])} (the prepare's), got "
                         f"{list(X.shape)}")
    check_dtype(X, "X", (meta["x_dtype"],))
    check_last_dim_contiguous(X, "X")
    C = X.shape[-1]
    lead = tuple(X.shape[:-2])
    check_tensor(B, "B")
    check_shape(B, "B", [*lead, C], layout="X's leading dims + [C]: the branch output")
    check_dtype(B, "B", (X.dtype,))
    check_last_dim_contiguous(B, "B")
    device = check_same_device(("X", X), ("B", B), ("handle", coef))
    launch_device_check(device, "X")
    return meta, coef, x_view
