"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of det RMSNorm.

Math: y = h * rsqrt(mean(h**2, -1) + eps) * (offset + weight) with h = x (+ residual)
(Zhang & Sennrich, 2019; ``offset = 1`` is the zero-centred weight of Gemma and Qwen3-Next,
Liger's ``offset``). Backward, with xhat = h * rstd and w = offset + weight:
    dh = rstd * (w*dy - xhat * mean(xhat * w*dy, -1)) (+ grad of the returned h)
    dweight = sum over rows of dy * xhat  (fixed-order partials, see kernels/bwd.py)
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_accumulator,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.triton_utils import launch_device_check, select_backend

from cake_rmsnorm_det_train.kernels.bwd import rmsnorm_bwd_kernel
from cake_rmsnorm_det_train.kernels.fwd import rmsnorm_fwd_kernel
from cake_rmsnorm_det_train.kernels.reduce import dweight_reduce_kernel
from cake_rmsnorm_det_train.plan import MAX_HIDDEN, RMSNormDetPlan, make_plan
from cake_rmsnorm_det_train.saved import RMSNormDetSavedSet, RMSNormDetWorkspace

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class RMSNormDetGrads(NamedTuple):
    """Gradients of :func:`rmsnorm_det_bwd`; ``None`` where there is none.

    dx: like x. dweight: like weight (``None`` when a ``dweight_accumulator`` received it).
    dresidual: like x, only with a residual (equal to dx).
    """

    dx: torch.Tensor | None
    dweight: torch.Tensor | None
    dresidual: torch.Tensor | None


class ModeKinds(NamedTuple):
    """What makes a package's entries det or nondet over these same checks and launches
    (this package's :data:`DET_KINDS`; cake-rmsnorm-nondet-train builds its own): the mode
    its plans, saved sets and workspaces carry, their classes (an entry refuses any other
    type or mode), its gradients tuple, its plan rule and default-plan cache, the namespace
    of its custom ops, its eager autograd Function, and what its backward runs before any
    launch (``None``: nothing; nondet: the deterministic-algorithms alert)."""

    mode: Mode
    plan_type: type
    saved_type: type
    workspace_type: type
    grads_type: type
    make_plan: Callable
    plan_cache: dict
    namespace: str
    function: type
    before_bwd: Callable[[], None] | None = None


# ----------------------------------------------------------------------------- checks


_Tensor = torch.Tensor
_FAST_EPS = (float,)


def _fast_ok(x, weight, eps, offset) -> bool:
    """True when the common call (no residual, no accumulator) passes every check of
    :func:`_check_inputs`; a False sends the call through the full checks and messages.
    Exists for host time: a kernel this short does not hide the full checks' host time."""
    if type(x) is not _Tensor or type(weight) is not _Tensor or type(eps) not in _FAST_EPS \
            or type(offset) is not float:
        return False
    dt = x.dtype
    if dt not in _FLOATS or (weight.dtype is not dt and weight.dtype is not torch.float32):
        return False
    if x.dim() < 1 or weight.dim() != 1:
        return False
    H = x.shape[-1]
    if not 1 < H <= MAX_HIDDEN or weight.shape[0] != H or x.stride(-1) != 1 or \
            weight.stride(0) != 1:
        return False
    if not 0.0 < eps < float("inf") or not -_F32_MAX <= offset <= _F32_MAX:
        return False
    dev = x.device
    return dev == weight.device and dev.type == _LAUNCH_DEVICE_TYPE


_F32_MAX = torch.finfo(torch.float32).max  # the kernels add the offset in fp32
_LAUNCH_DEVICE_TYPE = "cpu" if select_backend() == "interpreter" else "cuda"


#: the layout the input checks name in their messages (torch.nn.RMSNorm's over one dim)
X_LAYOUT = "[..., H]: normalized over the last dim, as torch.nn.RMSNorm(H)"


def _check_inputs(x, weight, eps, residual, dweight_accumulator, launch=True,
                  offset=0.0) -> torch.device:
    """The entry's input checks; ``launch=False`` skips the launch-device check only
    (:func:`saved_bytes` sizes tensors on any device, the meta device included)."""
    if residual is None and dweight_accumulator is None and _fast_ok(x, weight, eps, offset):
        return x.device
    check_tensor(x, "x")
    check_ndim(x, "x", min_ndim=1, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    H = x.shape[-1]
    if not 1 <= H <= MAX_HIDDEN:
        raise ValueError(f"x: last dimension (H) must be in [1, {MAX_HIDDEN}], got {H}")
    check_last_dim_contiguous(x, "x")
    check_tensor(weight, "weight")
    check_shape(weight, "weight", [H], layout="[H]: one weight per channel of x's last dim")
    check_dtype(weight, "weight", (torch.float32, x.dtype))
    check_last_dim_contiguous(weight, "weight")
    check_positive_finite(eps, "eps")
    check_offset(offset)
    if residual is not None:
        check_tensor(residual, "residual")
        check_shape(residual, "residual", list(x.shape), layout="x's shape")
        check_dtype(residual, "residual", (x.dtype,))
        check_last_dim_contiguous(residual, "residual")
    check_accumulator(dweight_accumulator, "dweight_accumulator", (H,))
    device = check_same_device(("x", x), ("weight", weight), ("residual", residual),
                               ("dweight_accumulator", dweight_accumulator))
    if launch:
        launch_device_check(device, "x")
    return device


def check_offset(offset, name: str = "offset") -> None:
    """``offset``: a real number (numpy scalars included, as ``eps``; not a bool) finite in
    fp32, |offset| <= 3.4028234663852886e38 (``ValueError`` otherwise): the kernels add it
    in fp32, where a larger one is inf. A chained comparison, so NaN fails and a traced
    float under torch.compile stays in the graph (as ``check_positive_finite``)."""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Real) or \
            not -_F32_MAX <= offset <= _F32_MAX:
        raise ValueError(f"{name}: must be a number finite in fp32, |offset| <= {_F32_MAX!r} "
                         f"(the weight is used as offset + weight), got {offset!r}")


def _offset_value(offset) -> float:
    """The checked offset as the kernels' constexpr: a Python float, -0.0 made 0.0 (a
    constexpr's repr is in Triton's cache key: one specialization per value, not per
    spelling of it)."""
    return float(offset) + 0.0


def check_call(kinds: ModeKinds, x, weight, eps, residual, plan, workspace,
               dweight_accumulator, *, launch: bool = True, offset=0.0):
    """Every check of the entry :func:`rmsnorm_det` (for ``kinds``), before any allocation
    or launch: ``(device, plan, partials)``, or ``ValueError``. The entries and the queries
    (:mod:`cake_rmsnorm_det_train.queries`) run this one function."""
    device = _check_inputs(x, weight, eps, residual, dweight_accumulator, launch, offset)
    plan = _resolve_plan(plan, x.shape[-1], x.dtype, device, kinds)
    partials = _resolve_workspace(workspace, plan, device, kinds)
    return device, plan, partials


def _resolve_plan(plan, H: int, dtype: torch.dtype, device: torch.device,
                  kinds: ModeKinds | None = None) -> RMSNormDetPlan:
    """``plan`` checked (type and mode of ``kinds``, default :data:`DET_KINDS`; made for
    H), or the default plan of ``kinds``."""
    kinds = kinds or DET_KINDS
    if plan is None:
        key = (H, dtype, device)
        plan = kinds.plan_cache.get(key)
        if plan is None:
            plan = kinds.make_plan(H, dtype, device)
            if not torch.compiler.is_compiling():
                kinds.plan_cache[key] = plan
        return plan
    require_mode(plan, kinds.plan_type, kinds.mode, name="plan")
    if plan.hidden_size != H:
        raise ValueError(f"plan: made for hidden_size={plan.hidden_size}, inputs have H={H}")
    return plan


def _resolve_workspace(workspace, plan: RMSNormDetPlan, device: torch.device,
                       kinds: ModeKinds | None = None):
    """``None``, or the partials of the caller's workspace after every check (type and mode
    of ``kinds``, default :data:`DET_KINDS`; plan, device, buffer shape and dtype)."""
    if workspace is None:
        return None
    kinds = kinds or DET_KINDS
    require_mode(workspace, kinds.workspace_type, kinds.mode, name="workspace")
    workspace.check(plan, device)
    partials = workspace["partials"]
    want = (plan.bwd_programs, plan.hidden_size)
    if tuple(partials.shape) != want or partials.dtype != torch.float32 or \
            not partials.is_contiguous():
        raise ValueError(
            f"workspace: 'partials' must be a contiguous fp32 tensor of shape {list(want)}, got "
            f"{str(partials.dtype)[6:]} {list(partials.shape)}; build it with "
            f"{kinds.workspace_type.__name__}.for_plan(plan, device)")
    return partials


# ----------------------------------------------------------------------------- launches


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # host-side; triton.cdiv is a JIT function with a costly host call


def _rows(t: torch.Tensor, n_rows: int, H: int) -> torch.Tensor:
    t2 = t.reshape(n_rows, H)
    return t2 if H == 1 or t2.stride(-1) == 1 else t2.contiguous()


def _launch_fwd(x, weight, residual, eps: float, plan: RMSNormDetPlan, offset: float = 0.0):
    H = x.shape[-1]
    n_rows = x.numel() // H
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    rstd = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, h, rstd
    x2 = _rows(x, n_rows, H)
    r2 = _rows(residual, n_rows, H) if residual is not None else x2
    y2 = y.view(n_rows, H)
    h2 = h.view(n_rows, H) if residual is not None else y2
    grid = (_cdiv(n_rows, plan.block_m_fwd),)
    strides = (x2.stride(0), r2.stride(0), y2.stride(0), h2.stride(0))
    # the largest offset any lane forms (masked rows of the last tile included)
    off64 = (grid[0] * plan.block_m_fwd) * max(strides) + plan.block_h >= 2**31
    rmsnorm_fwd_kernel[grid](
        x2, r2, weight, y2, h2, rstd,
        n_rows, H, *strides, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_M=plan.block_m_fwd, BLOCK_H=plan.block_h,
        OFF64=off64, W_OFFSET=offset, num_warps=plan.num_warps_fwd,
    )
    return y, h, rstd


def _launch_bwd(dy, dh, xh, weight, rstd, plan: RMSNormDetPlan, partials, acc,
                offset: float = 0.0):
    """Returns (dx, dweight); dweight is an empty tensor when ``acc`` took the sum."""
    H = xh.shape[-1]
    n_rows = xh.numel() // H
    dx = torch.empty(xh.shape, dtype=xh.dtype, device=xh.device)
    dw = torch.empty((H,) if acc is None else (0,), dtype=weight.dtype, device=xh.device)
    if n_rows == 0:
        if acc is None:
            dw.zero_()
        return dx, dw
    if partials is None:
        partials = torch.empty((plan.bwd_programs, H), dtype=torch.float32, device=xh.device)
    dy2 = _rows(dy, n_rows, H)
    x2 = _rows(xh, n_rows, H)
    dx2 = dx.view(n_rows, H)
    dh2 = _rows(dh, n_rows, H) if dh is not None else dy2
    rmsnorm_bwd_kernel[(plan.bwd_programs,)](
        dy2, dh2, x2, weight, rstd, dx2, partials,
        n_rows, H, plan.bwd_programs, dy2.stride(0), dh2.stride(0), x2.stride(0), dx2.stride(0),
        HAS_DH=dh is not None, BLOCK_M=plan.block_m_bwd, BLOCK_H=plan.block_h,
        W_OFFSET=offset, num_warps=plan.num_warps_bwd,
    )
    dweight_reduce_kernel[(_cdiv(H, plan.reduce_block_c),)](
        partials, dw, acc if acc is not None else partials, plan.bwd_programs, H,
        HAS_ACC=acc is not None, BLOCK_P=plan.reduce_block_p, BLOCK_C=plan.reduce_block_c,
        num_warps=4,
    )
    return dx, dw


# ----------------------------------------------------------------------------- autograd


class _RMSNormDetFunction(torch.autograd.Function):
    """Eager path (lower host overhead than the custom op); same launches, same bits.

    The workspace buffer and the accumulator stay on ctx as attributes, not saved tensors,
    so reusing them across calls before the backward (shared workspace, tied weights,
    pipeline schedules) does not trip autograd's version check. ``before_bwd``: called
    before the backward's launches (``None`` here; the nondet sibling's alert)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, plan, partials, acc, before_bwd=None,
                offset=0.0):
        y, h, rstd = _launch_fwd(x, weight, residual, eps, plan, offset)
        ctx.has_residual = residual is not None
        ctx.plan, ctx.partials, ctx.acc = plan, partials, acc
        ctx.before_bwd, ctx.offset = before_bwd, offset
        ctx.save_for_backward(h if residual is not None else x, weight, rstd)
        if residual is not None:
            return y, h
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh=None):
        if ctx.before_bwd is not None:
            ctx.before_bwd()
        xh, weight, rstd = ctx.saved_tensors
        dx, dw = _launch_bwd(dy, dh if ctx.has_residual else None, xh, weight, rstd, ctx.plan,
                             ctx.partials, ctx.acc, ctx.offset)
        dweight = dw if ctx.acc is None and ctx.needs_input_grad[1] else None
        return (dx, dweight, (dx if ctx.has_residual else None), None, None, None, None, None,
                None)


# ----------------------------------------------------------------------------- custom ops


def register_ops(kinds: ModeKinds):
    """Register the custom ops ``<kinds.namespace>::fwd`` / ``::bwd`` (with their fakes and
    autograd) over this module's launches; returns ``(fwd_op, bwd_op)``. Called once per
    namespace: here for :data:`DET_KINDS`, by cake-rmsnorm-nondet-train for its own."""
    ns = kinds.namespace

    @torch.library.custom_op(f"{ns}::fwd", mutates_args=())
    def _fwd_op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                eps: float, plan_fields: list[int], partials: torch.Tensor | None,
                dweight_accumulator: torch.Tensor | None, offset: float = 0.0,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        y, h, rstd = _launch_fwd(x, weight, residual, eps, plan, offset)
        return y, (h if h is not None else x.new_empty((0,))), rstd

    @_fwd_op.register_fake
    def _fwd_fake(x, weight, residual, eps, plan_fields, partials, dweight_accumulator,
                  offset=0.0):
        n_rows = x.numel() // x.shape[-1]
        y = x.new_empty(x.shape)
        h = x.new_empty(x.shape if residual is not None else (0,))
        return y, h, x.new_empty((n_rows,), dtype=torch.float32)

    @torch.library.custom_op(f"{ns}::bwd", mutates_args=("partials", "dweight_accumulator"))
    def _bwd_op(dy: torch.Tensor, dh: torch.Tensor | None, xh: torch.Tensor,
                weight: torch.Tensor, rstd: torch.Tensor, plan_fields: list[int],
                partials: torch.Tensor | None, dweight_accumulator: torch.Tensor | None,
                offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        if kinds.before_bwd is not None:
            kinds.before_bwd()  # at run time, before any launch
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        return _launch_bwd(dy, dh, xh, weight, rstd, plan, partials, dweight_accumulator,
                           offset)

    @_bwd_op.register_fake
    def _bwd_fake(dy, dh, xh, weight, rstd, plan_fields, partials, dweight_accumulator,
                  offset=0.0):
        H = xh.shape[-1]
        dw = weight.new_empty((H,) if dweight_accumulator is None else (0,))
        return xh.new_empty(xh.shape), dw

    def _setup_context(ctx, inputs, output):
        x, weight, residual, eps, plan_fields, partials, acc, offset = inputs
        _, h, rstd = output
        ctx.has_residual = residual is not None
        ctx.plan_fields, ctx.offset = plan_fields, offset
        ctx.save_for_backward(h if residual is not None else x, weight, rstd, partials, acc)

    def _backward(ctx, dy, dh, drstd):
        xh, weight, rstd, partials, acc = ctx.saved_tensors
        dh = dh if ctx.has_residual else None
        dx, dw = getattr(torch.ops, ns).bwd(
            dy, dh, xh, weight, rstd, ctx.plan_fields, partials, acc, ctx.offset)
        dweight = dw if acc is None and ctx.needs_input_grad[1] else None
        dres = dx if ctx.has_residual else None
        return dx, dweight, dres, None, None, None, None, None

    _fwd_op.register_autograd(_backward, setup_context=_setup_context)
    return _fwd_op, _bwd_op


_DEFAULT_PLANS: dict[tuple, RMSNormDetPlan] = {}

#: this package's kinds: det plans, saved sets and workspaces, ops ``cake_rmsnorm_det_train::``
DET_KINDS = ModeKinds(Mode.DET, RMSNormDetPlan, RMSNormDetSavedSet, RMSNormDetWorkspace,
                      RMSNormDetGrads, make_plan, _DEFAULT_PLANS, "cake_rmsnorm_det_train",
                      _RMSNormDetFunction)

_fwd_op, _bwd_op = register_ops(DET_KINDS)


# ----------------------------------------------------------------------------- entry bodies
# The bodies of the three entries for any ModeKinds: this package's entries run them with
# DET_KINDS, cake-rmsnorm-nondet-train's with its own (same checks, launches and bits; the
# objects' types and mode differ).


def run_autograd(kinds: ModeKinds, x, weight, eps, residual, plan, workspace,
                 dweight_accumulator, offset=0.0):
    """The body of :func:`rmsnorm_det` for ``kinds``."""
    _, plan, partials = check_call(kinds, x, weight, eps, residual, plan, workspace,
                                   dweight_accumulator, offset=offset)
    if not torch.compiler.is_compiling():
        return kinds.function.apply(x, weight, residual, float(eps), plan, partials,
                                    dweight_accumulator, kinds.before_bwd,
                                    _offset_value(offset))
    y, h, _ = getattr(torch.ops, kinds.namespace).fwd(
        x, weight, residual, float(eps), plan_to_op_fields(plan), partials,
        dweight_accumulator, _offset_value(offset))
    return (y, h) if residual is not None else y


def run_fwd(kinds: ModeKinds, x, weight, eps, residual, plan, offset=0.0):
    """The body of :func:`rmsnorm_det_fwd` for ``kinds``: ``(outputs, saved)``."""
    _, plan, _ = check_call(kinds, x, weight, eps, residual, plan, None, None, offset=offset)
    with torch.no_grad():
        y, h, rstd = _launch_fwd(x, weight, residual, float(eps), plan,
                                 _offset_value(offset))
    saved = kinds.saved_type(
        kinds.mode, {"xh": h if residual is not None else x, "weight": weight, "rstd": rstd},
        meta={"has_residual": residual is not None, "plan": plan,
              "offset": _offset_value(offset)})
    return ((y, h) if residual is not None else y), saved


def run_bwd(kinds: ModeKinds, dy, dh, saved, plan, workspace, dweight_accumulator):
    """The body of :func:`rmsnorm_det_bwd` for ``kinds``: every check, then
    ``kinds.before_bwd`` (before any launch), then the launches; a ``kinds.grads_type``."""
    require_mode(saved, kinds.saved_type, kinds.mode, name="saved")
    xh, weight, rstd = saved.tensors()
    H = xh.shape[-1]
    check_tensor(dy, "dy")
    check_shape(dy, "dy", list(xh.shape), layout="x's shape")
    check_dtype(dy, "dy", (xh.dtype,))
    if dh is not None:
        if not saved.has_residual:
            raise ValueError("dh: given, but the forward had no residual")
        check_tensor(dh, "dh")
        check_shape(dh, "dh", list(xh.shape), layout="x's shape")
        check_dtype(dh, "dh", (xh.dtype,))
    check_accumulator(dweight_accumulator, "dweight_accumulator", (H,))
    device = check_same_device(("saved", xh), ("dy", dy), ("dh", dh),
                               ("dweight_accumulator", dweight_accumulator))
    launch_device_check(device, "dy")
    offset = saved.meta.get("offset", 0.0)  # a saved set built by hand is checked too
    check_offset(offset, "saved.meta['offset']")
    plan = _resolve_plan(plan if plan is not None else saved.plan, H, xh.dtype, device, kinds)
    partials = _resolve_workspace(workspace, plan, device, kinds)
    if kinds.before_bwd is not None:
        kinds.before_bwd()
    with torch.no_grad():
        dx, dw = _launch_bwd(dy, dh, xh, weight, rstd, plan, partials, dweight_accumulator,
                             _offset_value(offset))
    return kinds.grads_type(dx, dw if dweight_accumulator is None else None,
                            dx if saved.has_residual else None)


# ----------------------------------------------------------------------------- public API


def rmsnorm_det(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                offset: float = 0.0, residual: torch.Tensor | None = None,
                plan: RMSNormDetPlan | None = None,
                workspace: RMSNormDetWorkspace | None = None,
                dweight_accumulator: torch.Tensor | None = None):
    """Deterministic RMSNorm with autograd:
    ``y = h * rsqrt(mean(h**2, -1) + eps) * (offset + weight)``.

    Args:
        x: ``[..., H]``, any leading dims, last dim contiguous; fp32, bf16 or fp16.
            1 <= H <= 65536.
        weight: ``[H]``, fp32 or x's dtype.
        eps: > 0, added to the mean square (default 1e-6).
        offset: a real number (int, float or numpy scalar) finite in fp32, added to the
            weight in fp32 inside the kernels (default 0; 1 for the zero-centred weights of
            Gemma and Qwen3-Next, as Liger's ``offset``). dweight is the gradient of
            ``weight`` itself. Each distinct value compiles its own kernels (a constexpr).
        residual: optional, like x (same shape and dtype). Then h = x + residual (rounded to
            x's dtype) is normalized and returned too.
        plan: an :class:`RMSNormDetPlan` for H (default: ``make_plan(H, x.dtype, device)``).
        workspace: an :class:`RMSNormDetWorkspace` for that plan (default: allocated per
            backward).
        dweight_accumulator: optional fp32 ``[H]`` (like Megatron's ``main_grad``). The
            backward adds dweight into it in the fixed order and ``weight`` gets no
            autograd gradient.

    Returns:
        ``y`` like x, or ``(y, h)`` with a residual.

    Determinism: dx, dresidual and dweight are bitwise repeatable for equal inputs, plan,
    hardware and accumulator contents (fixed-order partial sums, no atomics).

    Raises:
        ValueError: bad shape, dtype, device, stride, eps, offset, plan, workspace or mode,
            before any launch; the caller's tensors are not modified.

    Example::

        import torch
        from cake_rmsnorm_det_train import rmsnorm_det
        x = torch.randn(8, 64, requires_grad=True)  # CPU: Triton's interpreter
        w = torch.zeros(64, requires_grad=True)     # zero-centred: scales by 1 + w
        rmsnorm_det(x, w, 1e-6, offset=1.0).sum().backward()
    """
    return run_autograd(DET_KINDS, x, weight, eps, residual, plan, workspace,
                        dweight_accumulator, offset)


def rmsnorm_det_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                    offset: float = 0.0, residual: torch.Tensor | None = None,
                    plan: RMSNormDetPlan | None = None):
    """Low-level forward without autograd: returns ``(outputs, saved)``.

    ``outputs`` is what :func:`rmsnorm_det` returns (``y`` or ``(y, h)``); ``saved`` is an
    :class:`RMSNormDetSavedSet` for :func:`rmsnorm_det_bwd`. Arguments, shapes and errors
    as in :func:`rmsnorm_det`.
    """
    return run_fwd(DET_KINDS, x, weight, eps, residual, plan, offset)


def rmsnorm_det_bwd(dy: torch.Tensor, dh: torch.Tensor | None, saved: RMSNormDetSavedSet, *,
                    plan: RMSNormDetPlan | None = None,
                    workspace: RMSNormDetWorkspace | None = None,
                    dweight_accumulator: torch.Tensor | None = None) -> RMSNormDetGrads:
    """Low-level backward: gradients from ``dy`` (grad of y) and ``dh`` (grad of the
    returned h, only with a residual; ``None`` means zero).

    Args:
        dy: like x (the saved input: same shape and dtype); dh: like x or ``None``.
        saved: the :class:`RMSNormDetSavedSet` of :func:`rmsnorm_det_fwd`.
        plan: default: the forward's plan. workspace, dweight_accumulator: as in
            :func:`rmsnorm_det`.

    Returns:
        :class:`RMSNormDetGrads` ``(dx, dweight, dresidual)``.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode, shape/dtype/
            device mismatches, ``dh`` without a residual; before any launch.
    """
    return run_bwd(DET_KINDS, dy, dh, saved, plan, workspace, dweight_accumulator)
