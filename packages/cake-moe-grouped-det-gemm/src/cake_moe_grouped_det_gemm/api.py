"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the det MoE
grouped GEMM (``torch._grouped_mm(x, weight.transpose(-2, -1), offs)`` semantics).

Math, x ``[M, K]`` sorted by expert, weight ``[E, N, K]``, expert e's rows
``[end[e-1], end[e])`` (``end[-1] = 0``), rows past ``end[E-1]`` belong to no expert:
    y[rows of e]  = x[rows of e] · W[e]ᵀ            (rows of no expert: 0)
    dx[rows of e] = dy[rows of e] · W[e]             (rows of no expert: 0)
    dW[e]         = dy[rows of e]ᵀ · x[rows of e]    (split-K over fixed row slices of each
                                                      expert, ordered sum; empty expert: 0)
All products accumulate in fp32. The offsets are never read on the host: the launch grids
are bounds from the shapes, and the kernels read a schedule built on the device. With plan
``grouped_mm_fwd_dgrad = 1`` the forward and dgrad run ``torch._grouped_mm`` on the same
device-side row ends (its CUTLASS kernels read them on the device too), then a Triton kernel
zeroes the rows of no expert, which torch leaves unwritten; the wgrad stays cake's.
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
    TensorDescriptor,  # None before Triton 3.4 (tma_problem refuses tma=1 then)
    ordered_sum,
)
from cake_core.triton_utils import cdiv, launch_device_check, next_power_of_2

from cake_moe_grouped_det_gemm.kernels import (
    expert_order_kernel,
    grouped_mm_kernel,
    grouped_mm_tma_kernel,
    grouped_wgrad_kernel,
    grouped_wgrad_tma_kernel,
    row_ends_kernel,
    schedule_kernel,
    zero_tail_rows_kernel,
)
from cake_moe_grouped_det_gemm.plan import (
    MoEGroupedDetPlan,
    grouped_mm_problem,
    make_plan,
    tma_problem,
)
from cake_moe_grouped_det_gemm.saved import (
    MoEGroupedDetSavedSet,
    MoEGroupedDetWorkspace,
    workspace_shapes,
)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: experts per block of the metadata kernels (one program walks any E in such blocks)
META_BLOCK = 1024
#: experts per program, and per compared block, of the expert-order kernel
ORDER_BLOCK = 64

_INT32_MAX = 2**31 - 1
#: Rows per program of ``zero_tail_rows_kernel``; most columns per step of it.
TAIL_BLOCK_ROWS, TAIL_BLOCK_COLS = 32, 128


class MoEGroupedDetGrads(NamedTuple):
    """Gradients of :func:`moe_grouped_det_gemm_bwd`.

    dx: like x (``[M, K]``, contiguous). dweight: ``[E, N, K]`` in weight's dtype
    (``None`` when ``main_grad`` received it).
    """

    dx: torch.Tensor
    dweight: torch.Tensor | None


# ----------------------------------------------------------------------------- checks


def _check_group_sizes(offs, m_sizes, E: int, M: int, device: torch.device) -> None:
    if (offs is None) == (m_sizes is None):
        raise ValueError("offs: give exactly one of offs and m_sizes")
    name, t = ("offs", offs) if offs is not None else ("m_sizes", m_sizes)
    check_tensor(t, name)
    check_shape(t, name, [E], layout="[E]: one entry per expert of weight")
    check_dtype(t, name, (torch.int32,))
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, but x is on {device}; all inputs must share "
                         "one device")
    if t.device.type != "cpu" or torch.compiler.is_compiling():
        return  # values live on the device: read by the kernels only (no host sync)
    v = t.to(torch.int64)
    if name == "offs":
        if bool((v < 0).any()) or bool((v > M).any()):
            raise ValueError(f"offs: values must lie in [0, M={M}], got {v.tolist()}")
        if bool((v[1:] < v[:-1]).any()):
            raise ValueError(f"offs: must be non-decreasing, got {v.tolist()}")
    else:
        if bool((v < 0).any()):
            raise ValueError(f"m_sizes: values must be >= 0, got {v.tolist()}")
        if int(v.sum()) > M:
            raise ValueError(f"m_sizes: sum {int(v.sum())} exceeds the M={M} rows of x")


#: the layouts the input checks name in their messages
X_LAYOUT = "[M, K]: the tokens' rows grouped by expert, in_features last"
WEIGHT_LAYOUT = ("[E, N, K]: E stacked torch.nn.Linear weights [out_features, in_features]; "
                 "[E, K, N] (torch._grouped_mm's mat_b) is not served")


def _check_main_grad(main_grad, E: int, N: int, K: int) -> None:
    check_accumulator(main_grad, "main_grad", (E, N, K))


def _check_inputs(x, weight, offs, m_sizes, main_grad, *, launch: bool = True) -> torch.device:
    check_tensor(x, "x")
    check_ndim(x, "x", ndim=2, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    M, K = x.shape
    if K < 1:
        raise ValueError(f"x: in_features K (last dim) must be >= 1, got {K}")
    if M > _INT32_MAX:
        raise ValueError(f"x: at most {_INT32_MAX} rows (int32 offsets), got {M}")
    check_tensor(weight, "weight")
    check_ndim(weight, "weight", ndim=3, layout=WEIGHT_LAYOUT)
    check_shape(weight, "weight", [None, None, K], layout=WEIGHT_LAYOUT)
    check_dtype(weight, "weight", (x.dtype,))
    E, N = weight.shape[:2]
    if E < 1 or N < 1:
        raise ValueError(f"weight: needs E >= 1 experts and N >= 1 out_features, got "
                         f"{list(weight.shape)}")
    _check_main_grad(main_grad, E, N, K)
    device = check_same_device(("x", x), ("weight", weight), ("main_grad", main_grad))
    _check_group_sizes(offs, m_sizes, E, M, device)
    if launch:  # off for the size queries, which serve meta tensors
        launch_device_check(device, "x")
    return device


def _resolve_plan(plan, M, E: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
                  *, plan_cls=MoEGroupedDetPlan, rule=None) -> MoEGroupedDetPlan:
    """``plan``, or ``rule``'s, checked: a ``plan_cls`` of its mode for (E, N, K), dtype
    and device (``plan_cls`` / ``rule``, default :func:`make_plan`: the nondet sibling passes
    its own)."""
    if plan is None:
        plan = (rule or make_plan)(int(M), E, N, K, dtype, device)  # int(): a SymInt M specializes
    require_mode(plan, plan_cls, plan_cls.expected_mode, name="plan")
    if (plan.num_experts, plan.out_features, plan.in_features) != (E, N, K):
        raise ValueError(f"plan: made for num_experts={plan.num_experts}, out_features="
                         f"{plan.out_features}, in_features={plan.in_features}; inputs have "
                         f"E={E}, N={N}, K={K}")
    for why in (tma_problem(plan, dtype), grouped_mm_problem(plan, dtype, device)):
        if why is not None:
            raise ValueError(f"plan: {why}")
    return plan


def _resolve_workspace(workspace, plan: MoEGroupedDetPlan, device: torch.device, *,
                       ws_cls=MoEGroupedDetWorkspace):
    """The workspace's ``partials``, checked: a ``ws_cls`` of the plan's mode made for
    ``plan`` on ``device`` (``ws_cls``: the nondet sibling passes its own)."""
    if workspace is None:
        return None
    require_mode(workspace, ws_cls, type(plan).expected_mode, name="workspace")
    workspace.check(plan, device)
    want = workspace_shapes(plan)["partials"]
    t = workspace["partials"] if "partials" in workspace.names else None
    if t is None or tuple(t.shape) != want or t.dtype != torch.float32 or \
            not t.is_contiguous():
        got = "missing" if t is None else f"{str(t.dtype)[6:]} {list(t.shape)}"
        raise ValueError(
            f"workspace: 'partials' must be a contiguous fp32 tensor of shape {list(want)}, "
            f"got {got}; build it with {ws_cls.__name__}.for_plan(plan, device)")
    return t


def _checks(x, weight, offs, m_sizes, plan, workspace, main_grad, *,
            plan_cls=MoEGroupedDetPlan, rule=None, ws_cls=MoEGroupedDetWorkspace,
            launch: bool = True):
    """Every check the entry makes before a launch (also :func:`is_supported`'s) ->
    ``(device, plan, partials)``. ``plan_cls`` / ``rule`` / ``ws_cls``: the nondet
    sibling's; ``launch=False`` skips the backend's device check (size queries)."""
    device = _check_inputs(x, weight, offs, m_sizes, main_grad, launch=launch)
    E, N, K = weight.shape
    plan = _resolve_plan(plan, x.shape[0], E, N, K, x.dtype, device, plan_cls=plan_cls,
                         rule=rule)
    return device, plan, _resolve_workspace(workspace, plan, device, ws_cls=ws_cls)


def _row_ends(offs, m_sizes, M: int) -> torch.Tensor:
    """int32 ``[E]`` row ends as the kernels read them, computed on the device (no sync, one
    launch): the offsets (or the running sum of m_sizes) clamped to ``[0, M]``, then a
    running max, so rows are non-decreasing and in bounds whatever the values."""
    if torch.compiler.is_compiling():  # traced outside the ops: torch ops, the same values
        v = torch.cumsum(m_sizes.to(torch.int64), 0) if offs is None else offs.to(torch.int64)
        return torch.cummax(v.clamp(0, M), 0).values.to(torch.int32)
    src = offs if offs is not None else m_sizes
    src = src.contiguous()  # the kernel reads entry e at SRC + e (a strided view is served)
    E = src.shape[0]
    ends = torch.empty((E,), dtype=torch.int32, device=src.device)
    row_ends_kernel[(1,)](src, ends, E, M, IS_SIZES=offs is None,
                          BLOCK_E=min(META_BLOCK, next_power_of_2(E)), num_warps=4)
    return ends


# ----------------------------------------------------------------------------- launches


def _schedule(ends: torch.Tensor, M: int, block_m: int) -> torch.Tensor:
    """int32 ``[3, E + 1]`` tile schedule, built on the device (one launch): each group's
    first row, end and cumulative ``block_m`` row-tile count; group E is the tail (rows
    past the last expert), whose tiles store zeros."""
    E = ends.shape[0]
    sched = torch.empty((3, E + 1), dtype=torch.int32, device=ends.device)
    schedule_kernel[(1,)](ends, sched, E, M, block_m,
                          BLOCK_G=min(META_BLOCK, next_power_of_2(E + 1)), num_warps=4)
    return sched


def _desc(t: torch.Tensor, box: list[int]) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), box)


def _grouped_mm_tma(a, w, out, sched, G: int, grid, plan: MoEGroupedDetPlan,
                    forward: bool) -> None:
    """TMA launch of :func:`_grouped_mm` (``plan.tma``): ``w`` is the weight ``[E, N, K]``;
    ``forward``: ``B[e] = w[e]ᵀ`` (reduction over K), else ``B[e] = w[e]`` (over N)."""
    a, w = _row_major_ready(a), _row_major_ready(w)
    bm, bn, bk = plan.block_m, plan.block_n, plan.block_k
    grouped_mm_tma_kernel[grid](
        _desc(a, [bm, bk]), _desc(w, [1, bn, bk] if forward else [1, bk, bn]), out, sched,
        G, out.shape[1], a.shape[1], out.stride(0), out.stride(1),
        B_T=forward, IEEE=a.dtype == torch.float32 and not plan.allow_tf32,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_G=max(2, next_power_of_2(G)),
        num_warps=plan.num_warps, num_stages=plan.num_stages)


def _grouped_mm(a, b, out, ends, plan: MoEGroupedDetPlan, b_strides,
                forward: bool = True) -> None:
    """``out[rows of e] = a[rows of e] @ B[e]`` (B[e] ``[R, n_cols]`` with strides
    ``b_strides`` = (expert, reduction, column) over ``b``'s storage), tail rows zero.
    ``forward`` (``B[e] = b[e]ᵀ``, else ``b[e]``) steers the TMA launch only."""
    M, R = a.shape
    n_cols = out.shape[1]
    if M == 0:
        return
    G = ends.shape[0] + 1
    sched = _schedule(ends, M, plan.block_m)
    # upper bound of sum_g cdiv(m_g, block_m) without reading the offsets: each group adds
    # at most one partial tile
    grid = (cdiv(M, plan.block_m) + G, cdiv(n_cols, plan.block_n))
    if plan.tma:
        _grouped_mm_tma(a, b, out, sched, G, grid, plan, forward)
        return
    grouped_mm_kernel[grid](
        a, b, out, sched, G, n_cols, R,
        a.stride(0), a.stride(1), *b_strides, out.stride(0), out.stride(1),
        IEEE=a.dtype == torch.float32 and not plan.allow_tf32,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
        BLOCK_G=max(2, next_power_of_2(G)), num_warps=plan.num_warps,
        num_stages=plan.num_stages)


def _row_major_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when TMA descriptors and ``torch._grouped_mm`` read it as row-major
    (unit last stride, the other strides multiples of 16 bytes, rows not overlapping, a
    16-byte aligned start), else a copy in a fresh contiguous allocation (``clone``, not
    ``contiguous()``, which would return an already contiguous view at an unaligned start
    as is). One layout for every caller's view, so the bits do not depend on which strides
    the caller passed (torch picks its kernel by layout)."""
    es = t.element_size()
    if t.stride(-1) == 1 and t.stride(-2) >= t.shape[-1] and t.data_ptr() % 16 == 0 and \
            all((st * es) % 16 == 0 for st in t.stride()[:-1]):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _zero_tail_rows(out: torch.Tensor, ends: torch.Tensor) -> None:
    """Zeros into the rows of ``out`` past ``ends[E-1]`` (read on the device, no sync)."""
    M, n_cols = out.shape
    zero_tail_rows_kernel[(cdiv(M, TAIL_BLOCK_ROWS),)](
        out, ends, ends.shape[0], M, n_cols, out.stride(0), out.stride(1),
        BLOCK_R=TAIL_BLOCK_ROWS, BLOCK_C=min(TAIL_BLOCK_COLS, next_power_of_2(n_cols)),
        num_warps=4)


def _grouped_mm_torch(a, weight, ends, forward: bool, full: bool = False) -> torch.Tensor:
    """Plan ``grouped_mm_fwd_dgrad``: ``torch._grouped_mm(a, weight[e]ᵀ)`` (``forward``)
    or ``torch._grouped_mm(a, weight[e])`` over the row ends ``ends`` (int32, clamped and
    non-decreasing on the device, so torch reads rows in ``[0, M]`` only), then zeros in
    the rows past the last end (no launch when ``full``: the caller knows the last end is
    M, so there are none). torch allocates the output (``_grouped_mm`` has no ``out=``);
    with N and K multiples of 8 (:func:`grouped_mm_problem`) it is contiguous."""
    M = a.shape[0]
    n_cols = weight.shape[1] if forward else weight.shape[2]
    if M == 0:
        return torch.empty((0, n_cols), dtype=a.dtype, device=a.device)
    a, w = _row_major_ready(a), _row_major_ready(weight)
    out = torch._grouped_mm(a, w.transpose(-2, -1) if forward else w, offs=ends)
    if not full:
        _zero_tail_rows(out, ends)
    return out if out.is_contiguous() else out.contiguous()


def _launch_fwd(x, weight, ends, plan: MoEGroupedDetPlan, full: bool = False) -> torch.Tensor:
    """``full``: the caller built ``ends`` with its last end at M (every row routed)."""
    if plan.grouped_mm_fwd_dgrad:
        return _grouped_mm_torch(x, weight, ends, forward=True, full=full)
    y = torch.empty((x.shape[0], weight.shape[1]), dtype=x.dtype, device=x.device)
    # B[e] = weight[e]ᵀ: reduction over K (stride 2), columns over N (stride 1)
    _grouped_mm(x, weight, y, ends, plan, (weight.stride(0), weight.stride(2), weight.stride(1)))
    return y


def _expert_order(ends: torch.Tensor) -> torch.Tensor:
    """int32 ``[E]``: the experts by row count, most rows first, ties in index order (the
    order of a stable descending sort, built on the device in one launch; plan
    ``wgrad_order = 1``)."""
    E = ends.shape[0]
    order = torch.empty((E,), dtype=torch.int32, device=ends.device)
    expert_order_kernel[(cdiv(E, ORDER_BLOCK),)](ends, order, E, BLOCK_E=ORDER_BLOCK,
                                                 BLOCK_C=ORDER_BLOCK, num_warps=4)
    return order


def _launch_wgrad(dy, x, ends, plan: MoEGroupedDetPlan, out, partials, accumulate: bool):
    E, N, K = plan.num_experts, plan.out_features, plan.in_features
    S = plan.wgrad_splits
    tn, tk = cdiv(N, plan.wgrad_block_m), cdiv(K, plan.wgrad_block_n)
    dst = out if S == 1 else partials
    so = (0, *out.stride()) if S == 1 else partials.stride()
    wbm, wbn, wbk = plan.wgrad_block_m, plan.wgrad_block_n, plan.wgrad_block_k
    common = dict(SPLIT=S, ACCUMULATE=accumulate and S == 1,
                  IEEE=x.dtype == torch.float32 and not plan.allow_tf32,
                  BLOCK_M=wbm, BLOCK_N=wbn, BLOCK_K=wbk, REORDER=bool(plan.wgrad_order),
                  num_warps=plan.wgrad_num_warps, num_stages=plan.wgrad_num_stages)
    order = _expert_order(ends) if plan.wgrad_order else ends  # (unread without REORDER)
    if plan.tma:  # dy as [wbk, wbm] boxes of the row-major dy (transposed in the kernel)
        dy, x = _row_major_ready(dy), _row_major_ready(x)
        grouped_wgrad_tma_kernel[(E * tn * tk, S)](
            _desc(dy, [wbk, wbm]), _desc(x, [wbk, wbn]), dst, ends, order, N, K, tn, tk,
            *so, **common)
    else:
        grouped_wgrad_kernel[(E * tn * tk, S)](
            dy, x, dst, ends, order, N, K, tn, tk,
            dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), *so, **common)
    if S > 1:
        flat = partials.view(S, E * N * K)
        ordered_sum(flat, out=None if accumulate else out.view(E * N * K),
                    accumulate_into=out.view(E * N * K) if accumulate else None,
                    block=plan.reduce_block)


def _launch_bwd(dy, x, weight, ends, plan: MoEGroupedDetPlan, partials, main_grad,
                need_dx: bool, need_dw: bool, full: bool = False):
    """Returns (dx, dw); an empty ``(0,)`` tensor stands for each one not computed (dw also
    when ``main_grad`` took the sum)."""
    M = x.shape[0]
    E, N, K = weight.shape
    dev = x.device
    if need_dx and plan.grouped_mm_fwd_dgrad:
        dx = _grouped_mm_torch(dy, weight, ends, forward=False, full=full)
    else:
        dx = torch.empty((M, K) if need_dx else (0,), dtype=x.dtype, device=dev)
        if need_dx and M > 0:
            # B[e] = weight[e]: reduction over N (stride 1), columns over K (stride 2)
            _grouped_mm(dy, weight, dx, ends, plan,
                        (weight.stride(0), weight.stride(1), weight.stride(2)), forward=False)
    dw = torch.empty((E, N, K) if need_dw and main_grad is None else (0,), dtype=weight.dtype,
                     device=dev)
    if not need_dw:
        return dx, dw
    if M == 0:  # no rows: dW = 0, main_grad unchanged
        dw.zero_()
        return dx, dw
    S = plan.wgrad_splits
    if S > 1 and partials is None:
        partials = torch.empty(workspace_shapes(plan)["partials"], dtype=torch.float32,
                               device=dev)
    if main_grad is not None:
        _launch_wgrad(dy, x, ends, plan, main_grad, partials, True)
    else:
        _launch_wgrad(dy, x, ends, plan, dw, partials, False)
    return dx, dw


# ----------------------------------------------------------------------------- custom ops


def register_ops(namespace: str, plan_cls: type, mode: Mode = Mode.DET,
                 before_bwd=None) -> None:
    """Register ``<namespace>::fwd`` / ``::bwd`` (fakes and autograd included) over this
    package's launches, for plans of ``plan_cls`` in ``mode``; ``before_bwd`` (a nondet
    sibling's alert) runs in the backward op before any launch."""

    @torch.library.custom_op(f"{namespace}::fwd", mutates_args=())
    def fwd_op(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor,
               plan_fields: list[int], partials: torch.Tensor | None,
               main_grad: torch.Tensor | None, full: bool = False) -> torch.Tensor:
        plan = plan_from_op_fields(plan_cls, plan_fields, mode)
        return _launch_fwd(x, weight, ends, plan, full)

    @fwd_op.register_fake
    def _fwd_fake(x, weight, ends, plan_fields, partials, main_grad, full=False):
        return x.new_empty((x.shape[0], weight.shape[1]))

    @torch.library.custom_op(f"{namespace}::bwd", mutates_args=("partials", "main_grad"))
    def bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor,
               plan_fields: list[int], partials: torch.Tensor | None,
               main_grad: torch.Tensor | None, need_dx: bool, need_dw: bool,
               full: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        if before_bwd is not None:
            before_bwd()  # at run time under torch.compile, before any launch
        plan = plan_from_op_fields(plan_cls, plan_fields, mode)
        return _launch_bwd(dy, x, weight, ends, plan, partials, main_grad, need_dx, need_dw,
                           full)

    @bwd_op.register_fake
    def _bwd_fake(dy, x, weight, ends, plan_fields, partials, main_grad, need_dx, need_dw,
                  full=False):
        return (x.new_empty(x.shape if need_dx else (0,)),
                weight.new_empty(weight.shape if need_dw and main_grad is None else (0,)))

    def setup_context(ctx, inputs, output):
        x, weight, ends, plan_fields, partials, main_grad, *rest = inputs
        ctx.has_main_grad = main_grad is not None
        ctx.plan_fields = plan_fields
        ctx.full = bool(rest[0]) if rest else False
        ctx.save_for_backward(x, weight, ends, partials, main_grad)

    def backward(ctx, dy):
        x, weight, ends, partials, main_grad = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dx, dw = getattr(torch.ops, namespace).bwd(
            dy, x, weight, ends, ctx.plan_fields, partials, main_grad, need_dx, need_dw,
            ctx.full)
        return (dx if need_dx else None, dw if need_dw and not ctx.has_main_grad else None,
                None, None, None, None, None)

    fwd_op.register_autograd(backward, setup_context=setup_context)


register_ops("cake_moe_grouped_det_gemm", MoEGroupedDetPlan)


class _MoEGroupedDetFunction(torch.autograd.Function):
    """Eager path (lower host overhead than the custom op); same launches, same bits.

    The workspace buffer and ``main_grad`` stay on ctx as attributes, not saved tensors,
    so reusing them across calls before the backward does not trip autograd's version
    check."""

    @staticmethod
    def forward(ctx, x, weight, ends, plan, partials, main_grad, full=False):
        y = _launch_fwd(x, weight, ends, plan, full)
        ctx.plan, ctx.partials, ctx.main_grad, ctx.full = plan, partials, main_grad, full
        ctx.save_for_backward(x, weight, ends)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight, ends = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dx, dw = _launch_bwd(dy, x, weight, ends, ctx.plan, ctx.partials, ctx.main_grad,
                             need_dx, need_dw, ctx.full)
        return (dx if need_dx else None, dw if need_dw and ctx.main_grad is None else None,
                None, None, None, None, None)


# ----------------------------------------------------------------------------- public API

_ARGS_DOC = """
    Args:
        x: ``[M, K]`` tokens sorted by expert (M = 0 allowed), any strides; fp32, bf16 or
            fp16. K >= 1.
        weight: ``[E, N, K]`` (E stacked ``torch.nn.Linear`` weights), x's dtype, any
            strides. E, N >= 1.
        offs: int32 ``[E]`` on x's device: the cumulative end of each expert's rows
            (``torch._grouped_mm``'s convention); expert e owns rows
            ``[offs[e-1], offs[e])`` (``offs[-1]`` read as 0). Rows past ``offs[E-1]``
            belong to no expert: their y (and dx) is 0.
        m_sizes: int32 ``[E]``: rows per expert instead of ``offs`` (give exactly one).
"""

_CHECKS_DOC = """
    Checked before any launch (``ValueError``, the caller's tensors unmodified): shapes,
    dtypes, devices, ``offs``/``m_sizes`` dtype and shape, plan / workspace / saved set
    type, mode and plan key. The *values* of ``offs``/``m_sizes`` are checked on the host
    only when they live on the CPU, in eager mode (non-decreasing, in ``[0, M]``; sizes >= 0
    with sum <= M); under ``torch.compile`` they are never read on the host, on the CPU
    too (a read would break the graph), so there bad values are clamped as on a GPU and
    :func:`is_supported`'s ``False`` for them is no error. On a GPU they are never read on
    the host (no sync): the kernels read them through
    a device-side clamp, ``end[e] = max(end[e-1], min(max(offs[e], 0), M))``, so bad
    offsets cannot read or write out of bounds; they silently give the result of those
    clamped offsets (a decreasing offset makes that expert empty, an offset past M ends
    at M) rather than an error. With ``plan.grouped_mm_fwd_dgrad = 1`` torch._grouped_mm
    gets those same clamped row ends, so it cannot read or write out of bounds either, and
    the result is the same clamped one. That plan is also checked before any launch
    (``grouped_mm_problem``: torch has ``_grouped_mm``, bf16, N and K multiples of 8, on
    CUDA compute capability 9.x or 10.x).
"""


def moe_grouped_det_gemm(x: torch.Tensor, weight: torch.Tensor,
                         offs: torch.Tensor | None = None, *,
                         m_sizes: torch.Tensor | None = None,
                         plan: MoEGroupedDetPlan | None = None,
                         workspace: MoEGroupedDetWorkspace | None = None,
                         main_grad: torch.Tensor | None = None) -> torch.Tensor:
    return _entry(x, weight, offs, m_sizes, plan, workspace, main_grad)


moe_grouped_det_gemm.__doc__ = """Deterministic MoE grouped GEMM with autograd:
    ``y[rows of e] = x[rows of e] · weight[e]ᵀ``.
""" + _ARGS_DOC + """        plan: a :class:`MoEGroupedDetPlan` for (E, N, K) (default:
            ``make_plan(M, E, N, K, x.dtype, device)``).
        workspace: a :class:`MoEGroupedDetWorkspace` for that plan (default: allocated per
            backward when the plan splits the wgrad).
        main_grad: optional fp32 ``[E, N, K]``, contiguous (Megatron's gradient-accumulation
            fusion). The backward adds dW into it in place (the same ordered sum, added
            once), allocates no dW, and ``weight`` gets no autograd gradient.

    Returns:
        ``y``: ``[M, N]`` in x's dtype (contiguous). fp32 accumulation; fp32 products exact
        unless ``plan.allow_tf32``.

    Determinism: y, dx, dW and main_grad's new contents are bitwise repeatable for equal
    inputs (offsets included), plan, hardware and main_grad contents (fixed row slices per
    expert, ordered sums, no atomics). An expert with no rows gets an exact-zero dW. With
    ``plan.grouped_mm_fwd_dgrad = 1``, y and dx come from ``torch._grouped_mm``, which
    torch does not document as deterministic: it repeated bitwise in the measurements
    cited in :class:`MoEGroupedDetPlan` (one H200, torch 2.11; bf16) and in the package's
    CPU tests; bits are then fixed per torch build too.
""" + _CHECKS_DOC


def _entry(x, weight, offs, m_sizes, plan, workspace, main_grad):
    _, plan, partials = _checks(x, weight, offs, m_sizes, plan, workspace, main_grad)
    return _apply(x, weight, _row_ends(offs, m_sizes, x.shape[0]), plan, partials, main_grad)


def routed_gemm(x, weight, ends, *, plan=None):
    """:func:`moe_grouped_det_gemm` over row ends the MoE layer's routing built (int32
    ``[E]``, contiguous, non-decreasing, the last one M: every row routed, by
    construction): the same checks and bits, without the launch that clamps a caller's
    offsets into row ends nor the one that zeros rows past the last end (there are none)."""
    _, plan, partials = _checks(x, weight, ends, None, plan, None, None)
    return _apply(x, weight, ends, plan, partials, None, full=True)


def _apply(x, weight, ends, plan, partials, main_grad, full=False):
    if not torch.compiler.is_compiling():
        return _MoEGroupedDetFunction.apply(x, weight, ends, plan, partials, main_grad, full)
    return torch.ops.cake_moe_grouped_det_gemm.fwd(
        x, weight, ends, plan_to_op_fields(plan), partials, main_grad, full)


def moe_grouped_det_gemm_fwd(x: torch.Tensor, weight: torch.Tensor,
                             offs: torch.Tensor | None = None, *,
                             m_sizes: torch.Tensor | None = None,
                             plan: MoEGroupedDetPlan | None = None):
    """Low-level forward without autograd: returns ``(y, saved)``.

    ``saved`` is a :class:`MoEGroupedDetSavedSet` for :func:`moe_grouped_det_gemm_bwd`.
    Arguments, shapes, checks and errors as in :func:`moe_grouped_det_gemm`.
    """
    _, plan, _ = _checks(x, weight, offs, m_sizes, plan, None, None)
    M = x.shape[0]
    with torch.no_grad():
        ends = _row_ends(offs, m_sizes, M)
        y = _launch_fwd(x, weight, ends, plan)
    saved = MoEGroupedDetSavedSet(Mode.DET, {"x": x, "weight": weight, "ends": ends},
                                  meta={"plan": plan})
    return y, saved


def moe_grouped_det_gemm_bwd(dy: torch.Tensor, saved: MoEGroupedDetSavedSet, *,
                             plan: MoEGroupedDetPlan | None = None,
                             workspace: MoEGroupedDetWorkspace | None = None,
                             main_grad: torch.Tensor | None = None) -> MoEGroupedDetGrads:
    """Low-level backward: every gradient from ``dy`` (grad of y).

    Args:
        dy: ``[M, N]``, x's dtype, any strides.
        saved: the :class:`MoEGroupedDetSavedSet` of :func:`moe_grouped_det_gemm_fwd`.
        plan: default: the forward's plan. workspace, main_grad: as in
            :func:`moe_grouped_det_gemm`.

    Returns:
        :class:`MoEGroupedDetGrads` ``(dx, dweight)``; ``dweight`` is ``None`` when
        ``main_grad`` received dW.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode, shape/dtype/
            device mismatches; before any launch.
    """
    require_mode(saved, MoEGroupedDetSavedSet, Mode.DET, name="saved")
    x, weight, ends = saved.tensors()
    M = x.shape[0]
    E, N, K = weight.shape
    check_tensor(dy, "dy")
    check_shape(dy, "dy", [M, N], layout="[M, N]: the output's, x's rows by out_features")
    check_dtype(dy, "dy", (x.dtype,))
    _check_main_grad(main_grad, E, N, K)
    device = check_same_device(("saved", x), ("dy", dy), ("main_grad", main_grad))
    launch_device_check(device, "dy")
    plan = _resolve_plan(plan if plan is not None else saved.plan, M, E, N, K, x.dtype,
                         device)
    partials = _resolve_workspace(workspace, plan, device)
    with torch.no_grad():
        dx, dw = _launch_bwd(dy, x, weight, ends, plan, partials, main_grad, True, True)
    return MoEGroupedDetGrads(dx, dw if main_grad is None else None)
