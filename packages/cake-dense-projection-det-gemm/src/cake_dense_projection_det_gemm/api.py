"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the det dense
projection (``torch.nn.functional.linear``).

Math, x ``[M, K]`` (leading dims flattened), weight ``[N, K]``, bias ``[N]``:
    y = x · Wᵀ + bias
    dx = dy · W
    dW = dyᵀ · x        (over all M tokens; split-K over fixed token slices, ordered sum)
    dbias = Σ_tokens dy (same slices, same order)
All products accumulate in fp32 (cake_core.gemm).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_accumulator,
    check_dtype,
    check_ndim,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.gemm import (  # imports Triton after cake_core picked the backend
    FP32_DOTS,
    matmul,
    tma_readable,
)
from cake_core.triton_utils import launch_device_check

from cake_dense_projection_det_gemm.plan import (
    DenseProjectionDetPlan,
    make_plan,
    wgrad_tma_problem,
)
from cake_dense_projection_det_gemm.saved import (
    DenseProjectionDetSavedSet,
    DenseProjectionDetWorkspace,
    workspace_shapes,
)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class DenseProjectionDetGrads(NamedTuple):
    """Gradients of :func:`dense_projection_det_bwd`; ``None`` where there is none.

    dx: like x. dweight: like weight (``None`` when ``main_grad`` received it).
    dbias: ``[N]`` in bias's dtype, only when the forward had a bias.
    """

    dx: torch.Tensor | None
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None


# ----------------------------------------------------------------------------- checks


#: the layouts the input checks name in their messages: torch.nn.Linear's
X_LAYOUT = "[..., K]: in_features last, as torch.nn.functional.linear's input"
WEIGHT_LAYOUT = ("[N, K] = [out_features, in_features], torch.nn.Linear's layout; a "
                 "transposed [K, N] is not served")


def _check_main_grad(main_grad, N: int, K: int) -> None:
    check_accumulator(main_grad, "main_grad", (N, K))


def _check_inputs(x, weight, bias, main_grad, *, launch: bool = True) -> torch.device:
    check_tensor(x, "x")
    check_ndim(x, "x", min_ndim=1, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    K = x.shape[-1]
    if K < 1:
        raise ValueError(f"x: last dimension (in_features K) must be >= 1, got {K}")
    check_tensor(weight, "weight")
    check_ndim(weight, "weight", ndim=2, layout=WEIGHT_LAYOUT)
    check_shape(weight, "weight", [None, K], layout=WEIGHT_LAYOUT)
    check_dtype(weight, "weight", (x.dtype,))
    N = weight.shape[0]
    if N < 1:
        raise ValueError(f"weight: out_features N must be >= 1, got {N}")
    if bias is not None:
        check_tensor(bias, "bias")
        check_shape(bias, "bias", [N])
        check_dtype(bias, "bias", (x.dtype,))
    _check_main_grad(main_grad, N, K)
    device = check_same_device(("x", x), ("weight", weight), ("bias", bias),
                               ("main_grad", main_grad))
    if launch:  # off for the size queries, which serve meta tensors
        launch_device_check(device, "x")
    return device


def _resolve_plan(plan, M, N: int, K: int, dtype: torch.dtype, device: torch.device, *,
                  plan_cls=DenseProjectionDetPlan, rule=None) -> DenseProjectionDetPlan:
    """``plan``, or ``rule``'s, checked: a ``plan_cls`` of its mode for (N, K) and dtype
    (``plan_cls`` / ``rule``, default :func:`make_plan`: the nondet sibling passes its own)."""
    if plan is None:
        return (rule or make_plan)(int(M), N, K, dtype, device)  # int(): a SymInt M specializes
    require_mode(plan, plan_cls, plan_cls.expected_mode, name="plan")
    if (plan.out_features, plan.in_features) != (N, K):
        raise ValueError(f"plan: made for out_features={plan.out_features}, in_features="
                         f"{plan.in_features}; inputs have N={N}, K={K}")
    why = wgrad_tma_problem(plan, dtype)
    if why is not None:
        raise ValueError(f"plan: {why}")
    return plan


def _resolve_workspace(workspace, plan: DenseProjectionDetPlan, device: torch.device, *,
                       ws_cls=DenseProjectionDetWorkspace):
    """The workspace's (partials, bias_partials), checked: a ``ws_cls`` of the plan's mode
    made for ``plan`` on ``device`` (``ws_cls``: the nondet sibling passes its own)."""
    if workspace is None:
        return None, None
    require_mode(workspace, ws_cls, type(plan).expected_mode, name="workspace")
    workspace.check(plan, device)
    out = []
    for name, want in workspace_shapes(plan).items():
        t = workspace[name] if name in workspace.names else None
        if t is None or tuple(t.shape) != want or t.dtype != torch.float32 or \
                not t.is_contiguous():
            got = "missing" if t is None else f"{str(t.dtype)[6:]} {list(t.shape)}"
            raise ValueError(
                f"workspace: {name!r} must be a contiguous fp32 tensor of shape {list(want)}, "
                f"got {got}; build it with {ws_cls.__name__}.for_plan(plan, device)")
        out.append(t)
    return tuple(out)


def _checks(x, weight, bias, plan, workspace, main_grad, *, plan_cls=DenseProjectionDetPlan,
            rule=None, ws_cls=DenseProjectionDetWorkspace, launch: bool = True):
    """Every check the entry makes before a launch (also :func:`is_supported`'s) ->
    ``(device, plan, (partials, bias_partials))``. ``plan_cls`` / ``rule`` / ``ws_cls``: the
    nondet sibling's; ``launch=False`` skips the backend's device check (size queries)."""
    device = _check_inputs(x, weight, bias, main_grad, launch=launch)
    N, K = weight.shape
    plan = _resolve_plan(plan, x.numel() // K, N, K, x.dtype, device, plan_cls=plan_cls,
                         rule=rule)
    return device, plan, _resolve_workspace(workspace, plan, device, ws_cls=ws_cls)


# ----------------------------------------------------------------------------- launches


def _tiles(plan: DenseProjectionDetPlan) -> dict:
    return dict(block_m=plan.block_m, block_n=plan.block_n, block_k=plan.block_k,
                group_m=plan.group_m, num_warps=plan.num_warps, num_stages=plan.num_stages,
                allow_tf32=bool(plan.allow_tf32), fp32_precision=FP32_DOTS[plan.fp32_dots])


def _wgrad_tiles(plan: DenseProjectionDetPlan) -> dict:
    return dict(block_m=plan.wgrad_block_m, block_n=plan.wgrad_block_n,
                block_k=plan.wgrad_block_k, group_m=plan.wgrad_group_m,
                num_warps=plan.wgrad_num_warps, num_stages=plan.wgrad_num_stages,
                allow_tf32=bool(plan.allow_tf32), fp32_precision=FP32_DOTS[plan.fp32_dots])


def _launch_fwd(x, weight, bias, plan: DenseProjectionDetPlan) -> torch.Tensor:
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.numel() // K
    y = torch.empty((*x.shape[:-1], N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    x2 = x.reshape(M, K)
    y2 = y.view(M, N)
    if bias is not None:
        bias = bias.contiguous()
    if plan.cublas_fwd_dgrad:
        if bias is None:
            torch.mm(x2, weight.t(), out=y2)
        else:
            torch.addmm(bias, x2, weight.t(), out=y2)
    else:
        matmul(x2, weight.t(), y2, bias=bias, **_tiles(plan))
    return y


def _launch_bwd(dy, x, weight, plan: DenseProjectionDetPlan, partials, bias_partials,
                main_grad, need_dx: bool, need_dw: bool, need_db: bool):
    """Returns (dx, dw, db); an empty ``(0,)`` tensor stands for each one not computed
    (dw also when ``main_grad`` took the sum)."""
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.numel() // K
    dev = x.device
    dx = torch.empty(x.shape if need_dx else (0,), dtype=x.dtype, device=dev)
    dw = torch.empty((N, K) if need_dw and main_grad is None else (0,), dtype=weight.dtype,
                     device=dev)
    db = torch.empty((N,) if need_db else (0,), dtype=x.dtype, device=dev)
    if M == 0:
        dw.zero_()
        db.zero_()
        return dx, dw, db
    dy2 = dy.reshape(M, N)
    x2 = x.reshape(M, K)
    if need_dx:
        dx2 = dx.view(M, K)
        if plan.cublas_fwd_dgrad:
            torch.mm(dy2, weight, out=dx2)
        else:
            matmul(dy2, weight, dx2, **_tiles(plan))
    S = plan.wgrad_splits
    wt = _wgrad_tiles(plan)
    if need_dw:
        if plan.wgrad_tma:  # TMA reads the row-major dy and x; other layouts: a copy first
            wt.update(tma=True, persistent=plan.wgrad_tma == 2)
            dy2, x2 = tma_readable(dy2), tma_readable(x2)
        if S > 1 and partials is None:
            partials = torch.empty((S, N, K), dtype=torch.float32, device=dev)
        if main_grad is not None:
            matmul(dy2.t(), x2, main_grad, accumulate=True, split=S, partials=partials, **wt)
        else:
            matmul(dy2.t(), x2, dw, split=S, partials=partials, **wt)
    if need_db:
        if S > 1 and bias_partials is None:
            bias_partials = torch.empty((S, N), dtype=torch.float32, device=dev)
        ones = dy2.new_ones((1, 1)).expand(1, M)  # dbias = 1ᵀ · dy, same slices as dW
        matmul(ones, dy2, db.view(1, N), split=S,  # the pointer kernel, whatever wgrad_tma
               partials=bias_partials.view(S, 1, N) if S > 1 else None,
               **{**_wgrad_tiles(plan), "block_m": 16, "allow_tf32": False,
                  "fp32_precision": "ieee"})
    return dx, dw, db


# ----------------------------------------------------------------------------- custom ops


def register_ops(namespace: str, plan_cls: type, mode: Mode = Mode.DET,
                 before_bwd=None, launch_bwd=None) -> None:
    """Register ``<namespace>::fwd`` / ``::bwd`` (fakes and autograd included) over this
    package's launches, for plans of ``plan_cls`` in ``mode``; ``before_bwd`` (a nondet
    sibling's alert) runs in the backward op before any launch; ``launch_bwd`` (a nondet
    sibling's backward launches, :func:`_launch_bwd`'s signature) replaces this package's."""
    launch_bwd = launch_bwd or _launch_bwd

    @torch.library.custom_op(f"{namespace}::fwd", mutates_args=())
    def fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               plan_fields: list[int], partials: torch.Tensor | None,
               bias_partials: torch.Tensor | None, main_grad: torch.Tensor | None
               ) -> torch.Tensor:
        plan = plan_from_op_fields(plan_cls, plan_fields, mode)
        return _launch_fwd(x, weight, bias, plan)

    @fwd_op.register_fake
    def _fwd_fake(x, weight, bias, plan_fields, partials, bias_partials, main_grad):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.custom_op(f"{namespace}::bwd",
                             mutates_args=("partials", "bias_partials", "main_grad"))
    def bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
               plan_fields: list[int], partials: torch.Tensor | None,
               bias_partials: torch.Tensor | None, main_grad: torch.Tensor | None,
               need_dx: bool, need_dw: bool, need_db: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if before_bwd is not None:
            before_bwd()  # at run time under torch.compile, before any launch
        plan = plan_from_op_fields(plan_cls, plan_fields, mode)
        return launch_bwd(dy, x, weight, plan, partials, bias_partials, main_grad,
                          need_dx, need_dw, need_db)

    @bwd_op.register_fake
    def _bwd_fake(dy, x, weight, plan_fields, partials, bias_partials, main_grad,
                  need_dx, need_dw, need_db):
        N, K = weight.shape
        return (x.new_empty(x.shape if need_dx else (0,)),
                weight.new_empty((N, K) if need_dw and main_grad is None else (0,)),
                x.new_empty((N,) if need_db else (0,)))

    def setup_context(ctx, inputs, output):
        x, weight, bias, plan_fields, partials, bias_partials, main_grad = inputs
        ctx.has_bias = bias is not None
        ctx.has_main_grad = main_grad is not None
        ctx.plan_fields = plan_fields
        ctx.save_for_backward(x, weight, partials, bias_partials, main_grad)

    def backward(ctx, dy):
        x, weight, partials, bias_partials, main_grad = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_db = need_db and ctx.has_bias
        dx, dw, db = getattr(torch.ops, namespace).bwd(
            dy, x, weight, ctx.plan_fields, partials, bias_partials, main_grad,
            need_dx, need_dw, need_db)
        return (dx if need_dx else None, dw if need_dw and not ctx.has_main_grad else None,
                db if need_db else None, None, None, None, None)

    fwd_op.register_autograd(backward, setup_context=setup_context)


register_ops("cake_dense_projection_det_gemm", DenseProjectionDetPlan)


class _DenseProjectionDetFunction(torch.autograd.Function):
    """Eager path (lower host overhead than the custom op); same launches, same bits.

    The workspace buffers and ``main_grad`` stay on ctx as attributes, not saved tensors,
    so reusing them across calls before the backward (shared workspace, tied weights,
    pipeline schedules) does not trip autograd's version check."""

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
        x, weight = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_db = need_db and ctx.has_bias
        dx, dw, db = _launch_bwd(dy, x, weight, ctx.plan, ctx.partials, ctx.bias_partials,
                                 ctx.main_grad, need_dx, need_dw, need_db)
        return (dx if need_dx else None, dw if need_dw and ctx.main_grad is None else None,
                db if need_db else None, None, None, None, None)


# ----------------------------------------------------------------------------- public API


def dense_projection_det(x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, *,
                         plan: DenseProjectionDetPlan | None = None,
                         workspace: DenseProjectionDetWorkspace | None = None,
                         main_grad: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic dense projection with autograd: ``y = x · weightᵀ + bias``.

    Args:
        x: ``[..., K]``, any leading dims (0 tokens allowed), any strides; fp32, bf16 or
            fp16. K >= 1.
        weight: ``[N, K]`` (``torch.nn.Linear`` layout), x's dtype, any strides. N >= 1.
        bias: optional ``[N]``, x's dtype.
        plan: a :class:`DenseProjectionDetPlan` for (N, K) (default:
            ``make_plan(M, N, K, x.dtype, device)``, M = number of tokens).
        workspace: a :class:`DenseProjectionDetWorkspace` for that plan (default: allocated
            per backward when the plan splits the wgrad).
        main_grad: optional fp32 ``[N, K]``, contiguous (Megatron's gradient-accumulation
            fusion). The backward adds dW into it in place, in the fixed order, allocates
            no dW, and ``weight`` gets no autograd gradient.

    Returns:
        ``y``: ``[..., N]`` in x's dtype (contiguous). fp32 accumulation; fp32 inputs
        multiply as ``plan.fp32_dots`` says (the CUDA rule: "bf16x6", within fp32's
        accuracy; exact "ieee" on the CPU and older GPUs), as tf32 with
        ``plan.allow_tf32``.

    Determinism: y, dx, dweight, dbias and main_grad's new contents are bitwise repeatable
    for equal inputs, plan, hardware and main_grad contents (fixed token slices, ordered
    sums, no atomics).

    Raises:
        ValueError: bad shape, dtype, device, plan, workspace or mode, before any launch;
            the caller's tensors are not modified.
    """
    _, plan, (partials, bias_partials) = _checks(x, weight, bias, plan, workspace, main_grad)
    if not torch.compiler.is_compiling():
        return _DenseProjectionDetFunction.apply(x, weight, bias, plan, partials,
                                                 bias_partials, main_grad)
    return torch.ops.cake_dense_projection_det_gemm.fwd(
        x, weight, bias, plan_to_op_fields(plan), partials, bias_partials, main_grad)


def dense_projection_det_fwd(x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None, *,
                             plan: DenseProjectionDetPlan | None = None):
    """Low-level forward without autograd: returns ``(y, saved)``.

    ``saved`` is a :class:`DenseProjectionDetSavedSet` for :func:`dense_projection_det_bwd`.
    Arguments, shapes and errors as in :func:`dense_projection_det`.
    """
    _, plan, _ = _checks(x, weight, bias, plan, None, None)
    with torch.no_grad():
        y = _launch_fwd(x, weight, bias, plan)
    saved = DenseProjectionDetSavedSet(Mode.DET, {"x": x, "weight": weight},
                                       meta={"has_bias": bias is not None, "plan": plan})
    return y, saved


def dense_projection_det_bwd(dy: torch.Tensor, saved: DenseProjectionDetSavedSet, *,
                             plan: DenseProjectionDetPlan | None = None,
                             workspace: DenseProjectionDetWorkspace | None = None,
                             main_grad: torch.Tensor | None = None
                             ) -> DenseProjectionDetGrads:
    """Low-level backward: every gradient from ``dy`` (grad of y).

    Args:
        dy: ``[..., N]`` with x's leading dims, x's dtype, any strides.
        saved: the :class:`DenseProjectionDetSavedSet` of :func:`dense_projection_det_fwd`.
        plan: default: the forward's plan. workspace, main_grad: as in
            :func:`dense_projection_det`.

    Returns:
        :class:`DenseProjectionDetGrads` ``(dx, dweight, dbias)``.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode, shape/dtype/
            device mismatches; before any launch.
    """
    require_mode(saved, DenseProjectionDetSavedSet, Mode.DET, name="saved")
    x, weight = saved.tensors()
    N, K = weight.shape
    check_tensor(dy, "dy")
    check_shape(dy, "dy", [*x.shape[:-1], N], layout="[..., N]: like the output, x's leading dims")
    check_dtype(dy, "dy", (x.dtype,))
    _check_main_grad(main_grad, N, K)
    device = check_same_device(("saved", x), ("dy", dy), ("main_grad", main_grad))
    launch_device_check(device, "dy")
    plan = _resolve_plan(plan if plan is not None else saved.plan, x.numel() // K, N, K,
                         x.dtype, device)
    partials, bias_partials = _resolve_workspace(workspace, plan, device)
    with torch.no_grad():
        dx, dw, db = _launch_bwd(dy, x, weight, plan, partials, bias_partials, main_grad,
                                 True, True, saved.has_bias)
    return DenseProjectionDetGrads(dx, dw if main_grad is None else None,
                                   db if saved.has_bias else None)
