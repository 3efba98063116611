"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of det gated RMSNorm.

Math (fp32 inside), per row and per group of G contiguous elements, with the gate of
``activation`` (FLA's names), ``s = sigmoid(z)``:

    "silu" / "swish" (default; FLA, Qwen3-Next, Mamba2): gate = z * s, dgate = s * (1 + z * (1 - s))
    "sigmoid" (Kimi Delta Attention's output norm):      gate = s,     dgate = s * (1 - s)

    norm_before_gate=True  (FLA rms_norm_gated, Qwen3-Next): u = x,        y = u*rstd*w*gate
    norm_before_gate=False (Mamba2 RMSNormGated):            u = x * gate, y = u*rstd*w
    rstd = 1 / sqrt(mean_group(u**2) + eps)

Backward (xhat = u * rstd, dgate = d gate / dz):
    g  = w * dy * gate (before gate) or w * dy (after)
    du = rstd * (g - xhat * mean_group(xhat * g))
    before gate: dx = du,        dz = dy * xhat * w * dgate, dweight = sum_rows dy*gate*xhat
    after gate:  dx = du * gate, dz = du * x * dgate,        dweight = sum_rows dy*xhat
dweight: fixed-order fp32 partials (kernels/bwd.py), then cake_core.gemm.ordered_sum.
"""

from __future__ import annotations

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
from cake_core.gemm import ordered_sum
from cake_core.triton_utils import is_interpreting, launch_device_check, select_backend

from cake_rmsnorm_silu_gate_det_train.kernels.bwd import rmsnorm_silu_gate_bwd_kernel
from cake_rmsnorm_silu_gate_det_train.kernels.fwd import rmsnorm_silu_gate_fwd_kernel
from cake_rmsnorm_silu_gate_det_train.plan import (
    MAX_HIDDEN,
    RMSNormSiluGateDetPlan,
    check_group_size,
    make_plan,
)
from cake_rmsnorm_silu_gate_det_train.reference import ACTIVATIONS, check_activation
from cake_rmsnorm_silu_gate_det_train.saved import (
    RMSNormSiluGateDetSavedSet,
    RMSNormSiluGateDetWorkspace,
)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: the layout the input checks name in their messages: normalized over the last dim (in
#: groups of group_size channels when given), as FLA's / Mamba2's gated RMSNorm
X_LAYOUT = "[..., D]: normalized over the last dim (per group with group_size)"


class RMSNormSiluGateDetGrads(NamedTuple):
    """Gradients of :func:`rmsnorm_silu_gate_det_bwd`.

    dx: like x. dz: like z. dweight: like weight (``None`` when a ``dweight_accumulator``
    received it).
    """

    dx: torch.Tensor
    dz: torch.Tensor
    dweight: torch.Tensor | None


class ModeKinds(NamedTuple):
    """What makes a package's entries det or nondet over these same checks and launches
    (this package's :data:`DET_KINDS`; cake-rmsnorm-silu-gate-nondet-train builds its own):
    the mode its plans, saved sets and workspaces carry, their classes (an entry refuses
    any other type or mode), its gradients tuple, its plan rule and default-plan cache, the
    namespace of its custom ops, its eager autograd Function, and what its backward runs
    before any launch (``None``: nothing; nondet: the deterministic-algorithms alert)."""

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
_LAUNCH_DEVICE_TYPE = "cpu" if select_backend() == "interpreter" else "cuda"


def _fast_ok(x, z, weight, eps, norm_before_gate, group_size) -> bool:
    """True when the common call (no groups, no accumulator) passes every check of
    :func:`_check_inputs`; a False sends the call through the full checks and messages.
    Exists for host time: a kernel this short does not hide the full checks' host time."""
    if type(x) is not _Tensor or type(z) is not _Tensor or type(weight) is not _Tensor or \
            type(eps) is not float or type(norm_before_gate) is not bool or \
            group_size is not None:
        return False
    dt = x.dtype
    if dt not in _FLOATS or z.dtype is not dt or \
            (weight.dtype is not dt and weight.dtype is not torch.float32):
        return False
    if x.dim() < 1 or weight.dim() != 1 or z.shape != x.shape:
        return False
    D = x.shape[-1]
    if not 1 < D <= MAX_HIDDEN or weight.shape[0] != D or x.stride(-1) != 1 or \
            z.stride(-1) != 1 or weight.stride(0) != 1:
        return False
    if not 0.0 < eps < float("inf"):
        return False
    dev = x.device
    return dev == z.device and dev == weight.device and dev.type == _LAUNCH_DEVICE_TYPE


def _check_inputs(x, z, weight, eps, norm_before_gate, group_size, activation,
                  dweight_accumulator, launch=True) -> tuple[torch.device, int, str]:
    """All argument checks of the entry points; returns ``(device, G, gate)`` with ``gate``
    the canonical activation (``"silu"`` or ``"sigmoid"``). Raises ValueError before
    anything is allocated or launched. ``launch=False`` skips the launch-device check only
    (``saved_bytes`` sizes tensors on any device, the meta device included)."""
    act = ACTIVATIONS.get(activation) if type(activation) is str else None
    if act is not None and dweight_accumulator is None and \
            _fast_ok(x, z, weight, eps, norm_before_gate, group_size):
        return x.device, x.shape[-1], act
    check_tensor(x, "x")
    check_ndim(x, "x", min_ndim=1, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    D = x.shape[-1]
    if not 1 <= D <= MAX_HIDDEN:
        raise ValueError(f"x: last dimension (D) must be in [1, {MAX_HIDDEN}], got {D}")
    check_last_dim_contiguous(x, "x")
    check_tensor(z, "z")
    check_shape(z, "z", list(x.shape), layout="x's shape: the gate of each element")
    check_dtype(z, "z", (x.dtype,))
    check_last_dim_contiguous(z, "z")
    check_tensor(weight, "weight")
    check_shape(weight, "weight", [D], layout="[D]: one weight per channel of x's last dim")
    check_dtype(weight, "weight", (torch.float32, x.dtype))
    check_last_dim_contiguous(weight, "weight")
    check_positive_finite(eps, "eps")
    if not isinstance(norm_before_gate, bool):
        raise ValueError(f"norm_before_gate: expected a bool, got {norm_before_gate!r}")
    act = check_activation(activation)
    G = check_group_size(group_size, D)
    check_accumulator(dweight_accumulator, "dweight_accumulator", (D,))
    device = check_same_device(("x", x), ("z", z), ("weight", weight),
                               ("dweight_accumulator", dweight_accumulator))
    if launch:
        launch_device_check(device, "x")
    return device, G, act


def check_call(kinds: ModeKinds, x, z, weight, eps, norm_before_gate, group_size, activation,
               plan, workspace, dweight_accumulator, *, launch: bool = True):
    """Every check of the entry :func:`rmsnorm_silu_gate_det` (for ``kinds``), before any
    allocation or launch: ``(device, G, gate, plan, partials)``, or ``ValueError``. The
    entries and the queries (:mod:`cake_rmsnorm_silu_gate_det_train.queries`) run this one
    function."""
    device, G, act = _check_inputs(x, z, weight, eps, norm_before_gate, group_size,
                                   activation, dweight_accumulator, launch)
    plan = _resolve_plan(plan, x.shape[-1], G, x.dtype, device, kinds)
    partials = _resolve_workspace(workspace, plan, device, kinds)
    return device, G, act, plan, partials


def _resolve_plan(plan, D: int, G: int, dtype: torch.dtype, device: torch.device,
                  kinds: ModeKinds | None = None) -> RMSNormSiluGateDetPlan:
    """``plan`` checked (type and mode of ``kinds``, default :data:`DET_KINDS`; made for
    (D, G)), or the default plan of ``kinds``."""
    kinds = kinds or DET_KINDS
    if plan is None:
        key = (D, G, dtype, device)
        plan = kinds.plan_cache.get(key)
        if plan is None:
            plan = kinds.make_plan(D, dtype, device, group_size=G)
            if not torch.compiler.is_compiling():
                kinds.plan_cache[key] = plan
        return plan
    require_mode(plan, kinds.plan_type, kinds.mode, name="plan")
    if plan.hidden_size != D or plan.group_size != G:
        raise ValueError(
            f"plan: made for hidden_size={plan.hidden_size}, group_size={plan.group_size}; "
            f"the call has D={D}, group_size={G}")
    return plan


def _resolve_workspace(workspace, plan: RMSNormSiluGateDetPlan, device: torch.device,
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


def _rows(t: torch.Tensor, n_rows: int, D: int) -> torch.Tensor:
    """``t`` as ``[n_rows, D]`` with a unit column stride (a copy only if it has none, e.g.
    an expanded upstream gradient)."""
    t2 = t.reshape(n_rows, D)
    return t2 if D == 1 or t2.stride(-1) == 1 else t2.contiguous()


def _launch_fwd(x, z, weight, eps: float, norm_before_gate: bool, activation: str,
                plan: RMSNormSiluGateDetPlan):
    """Returns ``(y, rstd)``; ``activation`` is canonical (``"silu"`` or ``"sigmoid"``)."""
    D = x.shape[-1]
    G = plan.group_size
    n_rows = x.numel() // D
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty((n_rows, D // G), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, rstd
    x2 = _rows(x, n_rows, D)
    z2 = _rows(z, n_rows, D)
    y2 = y.view(n_rows, D)
    grid = (_cdiv(n_rows, plan.block_m_fwd),)
    strides = (x2.stride(0), z2.stride(0), y2.stride(0))
    n_groups = D // G
    # the largest offset any lane forms (masked rows of the last tile included)
    off64 = (grid[0] * plan.block_m_fwd * max(*strides, n_groups)
             + plan.block_ng * plan.block_g >= 2**31)
    rmsnorm_silu_gate_fwd_kernel[grid](
        x2, z2, weight, y2, rstd,
        n_rows, G, n_groups, *strides, eps,
        NORM_BEFORE_GATE=norm_before_gate, ACTIVATION=activation, BLOCK_M=plan.block_m_fwd,
        BLOCK_NG=plan.block_ng, BLOCK_G=plan.block_g, OFF64=off64,
        num_warps=plan.num_warps_fwd,
    )
    return y, rstd


def _launch_bwd(dy, x, z, weight, rstd, norm_before_gate: bool, activation: str,
                plan: RMSNormSiluGateDetPlan, partials, acc):
    """Returns ``(dx, dz, dweight)``; dweight is an empty ``[0]`` tensor when ``acc`` took
    the sum (``acc += ordered sum``). ``activation`` is the forward's, canonical."""
    D = x.shape[-1]
    G = plan.group_size
    n_rows = x.numel() // D
    dev = x.device
    dx = torch.empty(x.shape, dtype=x.dtype, device=dev)
    dz = torch.empty(z.shape, dtype=z.dtype, device=dev)
    if n_rows == 0:
        dw = torch.zeros((D,) if acc is None else (0,), dtype=weight.dtype, device=dev)
        return dx, dz, dw
    if partials is None:
        partials = torch.empty((plan.bwd_programs, D), dtype=torch.float32, device=dev)
    dy2 = _rows(dy, n_rows, D)
    x2 = _rows(x, n_rows, D)
    z2 = _rows(z, n_rows, D)
    dx2 = dx.view(n_rows, D)
    dz2 = dz.view(n_rows, D)
    rmsnorm_silu_gate_bwd_kernel[(plan.bwd_programs,)](
        dy2, x2, z2, weight, rstd, dx2, dz2, partials,
        n_rows, D, G, D // G, plan.bwd_programs,
        dy2.stride(0), x2.stride(0), z2.stride(0), dx2.stride(0), dz2.stride(0),
        NORM_BEFORE_GATE=norm_before_gate, ACTIVATION=activation, BLOCK_M=plan.block_m_bwd,
        BLOCK_NG=plan.block_ng, BLOCK_G=plan.block_g, STAGES=plan.bwd_stages,
        num_warps=plan.num_warps_bwd,
    )
    if acc is not None:
        ordered_sum(partials, accumulate_into=acc, block=plan.reduce_block)
        return dx, dz, torch.empty((0,), dtype=weight.dtype, device=dev)
    if weight.dtype == torch.float32 or not is_interpreting():
        dw = torch.empty((D,), dtype=weight.dtype, device=dev)
        ordered_sum(partials, out=dw, block=plan.reduce_block)  # cast once, in the kernel
        return dx, dz, dw
    # The interpreter's in-kernel bf16 cast truncates: sum in fp32, cast once on the host
    # (round to nearest even, as the compiled kernel's cast).
    dw32 = torch.empty((D,), dtype=torch.float32, device=dev)
    ordered_sum(partials, out=dw32, block=plan.reduce_block)
    return dx, dz, dw32.to(weight.dtype)


# ----------------------------------------------------------------------------- autograd


class _RMSNormSiluGateDetFunction(torch.autograd.Function):
    """Eager path (lower host overhead than the custom op); same launches, same bits.

    The workspace buffer and the accumulator stay on ctx as attributes, not saved tensors,
    so reusing them across calls before the backward (shared workspace, tied weights,
    pipeline schedules) does not trip autograd's version check. ``before_bwd``: called
    before the backward's launches (``None`` here; the nondet sibling's alert)."""

    @staticmethod
    def forward(ctx, x, z, weight, eps, norm_before_gate, activation, plan, partials, acc,
                before_bwd=None):
        y, rstd = _launch_fwd(x, z, weight, eps, norm_before_gate, activation, plan)
        ctx.norm_before_gate = norm_before_gate
        ctx.activation = activation
        ctx.plan, ctx.partials, ctx.acc = plan, partials, acc
        ctx.before_bwd = before_bwd
        ctx.save_for_backward(x, z, weight, rstd)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        if ctx.before_bwd is not None:
            ctx.before_bwd()
        x, z, weight, rstd = ctx.saved_tensors
        dx, dz, dw = _launch_bwd(dy, x, z, weight, rstd, ctx.norm_before_gate, ctx.activation,
                                 ctx.plan, ctx.partials, ctx.acc)
        dweight = dw if ctx.acc is None and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None,
                dz if ctx.needs_input_grad[1] else None, dweight, None, None, None, None, None,
                None, None)


# ----------------------------------------------------------------------------- custom ops


def register_ops(kinds: ModeKinds):
    """Register the custom ops ``<kinds.namespace>::fwd`` / ``::bwd`` (with their fakes and
    autograd) over this module's launches; returns ``(fwd_op, bwd_op)``. Called once per
    namespace: here for :data:`DET_KINDS`, by cake-rmsnorm-silu-gate-nondet-train for its
    own."""
    ns = kinds.namespace

    @torch.library.custom_op(f"{ns}::fwd", mutates_args=())
    def _fwd_op(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                norm_before_gate: bool, activation: str, plan_fields: list[int],
                partials: torch.Tensor | None,
                dweight_accumulator: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        return _launch_fwd(x, z, weight, eps, norm_before_gate, check_activation(activation),
                           plan)

    @_fwd_op.register_fake
    def _fwd_fake(x, z, weight, eps, norm_before_gate, activation, plan_fields, partials,
                  dweight_accumulator):
        D = x.shape[-1]
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        n_rows = x.numel() // D
        return x.new_empty(x.shape), x.new_empty((n_rows, D // plan.group_size),
                                                 dtype=torch.float32)

    @torch.library.custom_op(f"{ns}::bwd", mutates_args=("partials", "dweight_accumulator"))
    def _bwd_op(dy: torch.Tensor, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                rstd: torch.Tensor, norm_before_gate: bool, activation: str,
                plan_fields: list[int], partials: torch.Tensor | None,
                dweight_accumulator: torch.Tensor | None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if kinds.before_bwd is not None:
            kinds.before_bwd()  # at run time, before any launch
        plan = plan_from_op_fields(kinds.plan_type, plan_fields, kinds.mode)
        return _launch_bwd(dy, x, z, weight, rstd, norm_before_gate,
                           check_activation(activation), plan, partials, dweight_accumulator)

    @_bwd_op.register_fake
    def _bwd_fake(dy, x, z, weight, rstd, norm_before_gate, activation, plan_fields, partials,
                  dweight_accumulator):
        D = x.shape[-1]
        dw = weight.new_empty((D,) if dweight_accumulator is None else (0,))
        return x.new_empty(x.shape), z.new_empty(z.shape), dw

    def _setup_context(ctx, inputs, output):
        x, z, weight, eps, norm_before_gate, activation, plan_fields, partials, acc = inputs
        _, rstd = output
        ctx.norm_before_gate = norm_before_gate
        ctx.activation = activation
        ctx.plan_fields = plan_fields
        ctx.save_for_backward(x, z, weight, rstd, partials, acc)

    def _backward(ctx, dy, drstd):
        x, z, weight, rstd, partials, acc = ctx.saved_tensors
        dx, dz, dw = getattr(torch.ops, ns).bwd(
            dy, x, z, weight, rstd, ctx.norm_before_gate, ctx.activation, ctx.plan_fields,
            partials, acc)
        dweight = dw if acc is None and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None,
                dz if ctx.needs_input_grad[1] else None, dweight, None, None, None, None,
                None, None)

    _fwd_op.register_autograd(_backward, setup_context=_setup_context)
    return _fwd_op, _bwd_op


_DEFAULT_PLANS: dict[tuple, RMSNormSiluGateDetPlan] = {}

#: this package's kinds: det plans, saved sets and workspaces, ops
#: ``cake_rmsnorm_silu_gate_det_train::``
DET_KINDS = ModeKinds(Mode.DET, RMSNormSiluGateDetPlan, RMSNormSiluGateDetSavedSet,
                      RMSNormSiluGateDetWorkspace, RMSNormSiluGateDetGrads, make_plan,
                      _DEFAULT_PLANS, "cake_rmsnorm_silu_gate_det_train",
                      _RMSNormSiluGateDetFunction)

_fwd_op, _bwd_op = register_ops(DET_KINDS)


# ----------------------------------------------------------------------------- entry bodies
# The bodies of the three entries for any ModeKinds: this package's entries run them with
# DET_KINDS, cake-rmsnorm-silu-gate-nondet-train's with its own (same checks, launches and
# bits; the objects' types and mode differ).


def run_autograd(kinds: ModeKinds, x, z, weight, eps, norm_before_gate, group_size,
                 activation, plan, workspace, dweight_accumulator):
    """The body of :func:`rmsnorm_silu_gate_det` for ``kinds``."""
    _, _, act, plan, partials = check_call(kinds, x, z, weight, eps, norm_before_gate,
                                           group_size, activation, plan, workspace,
                                           dweight_accumulator)
    if not torch.compiler.is_compiling():
        return kinds.function.apply(x, z, weight, float(eps), norm_before_gate, act, plan,
                                    partials, dweight_accumulator, kinds.before_bwd)
    y, _ = getattr(torch.ops, kinds.namespace).fwd(
        x, z, weight, float(eps), norm_before_gate, act, plan_to_op_fields(plan), partials,
        dweight_accumulator)
    return y


def run_fwd(kinds: ModeKinds, x, z, weight, eps, norm_before_gate, group_size, activation,
            plan):
    """The body of :func:`rmsnorm_silu_gate_det_fwd` for ``kinds``: ``(y, saved)``."""
    _, G, act, plan, _ = check_call(kinds, x, z, weight, eps, norm_before_gate, group_size,
                                    activation, plan, None, None)
    with torch.no_grad():
        y, rstd = _launch_fwd(x, z, weight, float(eps), norm_before_gate, act, plan)
    saved = kinds.saved_type(
        kinds.mode, {"x": x, "z": z, "weight": weight, "rstd": rstd},
        meta={"norm_before_gate": norm_before_gate, "group_size": G, "eps": float(eps),
              "activation": act, "plan": plan})
    return y, saved


def run_bwd(kinds: ModeKinds, dy, saved, plan, workspace, dweight_accumulator):
    """The body of :func:`rmsnorm_silu_gate_det_bwd` for ``kinds``: every check, then
    ``kinds.before_bwd`` (before any launch), then the launches; a ``kinds.grads_type``."""
    require_mode(saved, kinds.saved_type, kinds.mode, name="saved")
    act = check_activation(saved.meta.get("activation"), "saved: meta 'activation'")
    x, z, weight, rstd = saved.tensors()
    D = x.shape[-1]
    check_tensor(dy, "dy")
    check_shape(dy, "dy", list(x.shape), layout="x's shape")
    check_dtype(dy, "dy", (x.dtype,))
    check_accumulator(dweight_accumulator, "dweight_accumulator", (D,))
    device = check_same_device(("saved", x), ("dy", dy),
                               ("dweight_accumulator", dweight_accumulator))
    launch_device_check(device, "dy")
    plan = _resolve_plan(plan if plan is not None else saved.plan, D, saved.group_size,
                         x.dtype, device, kinds)
    partials = _resolve_workspace(workspace, plan, device, kinds)
    if kinds.before_bwd is not None:
        kinds.before_bwd()
    with torch.no_grad():
        dx, dz, dw = _launch_bwd(dy, x, z, weight, rstd, saved.norm_before_gate, act, plan,
                                 partials, dweight_accumulator)
    return kinds.grads_type(dx, dz, dw if dweight_accumulator is None else None)


# ----------------------------------------------------------------------------- public API


def rmsnorm_silu_gate_det(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                          eps: float = 1e-6, *, norm_before_gate: bool = True,
                          group_size: int | None = None, activation: str = "silu",
                          plan: RMSNormSiluGateDetPlan | None = None,
                          workspace: RMSNormSiluGateDetWorkspace | None = None,
                          dweight_accumulator: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic gated RMSNorm (SiLU or sigmoid gate), with autograd.

    ``norm_before_gate=True`` (FLA ``rms_norm_gated`` / ``FusedRMSNormGated``; Qwen3-Next's
    gated DeltaNet output norm with ``activation="silu"``, Kimi Delta Attention's with
    ``activation="sigmoid"``)::

        y = x * rsqrt(mean(x**2) + eps) * weight * gate(z)

    ``norm_before_gate=False`` (Mamba2 ``RMSNormGated``, ``mamba_ssm`` layernorm_gated)::

        u = x * gate(z);  y = u * rsqrt(mean(u**2) + eps) * weight

    ``gate(z) = silu(z) = z * sigmoid(z)`` (``activation="silu"`` or ``"swish"``, FLA's
    name for it) or ``gate(z) = sigmoid(z)`` (``activation="sigmoid"``), the gates of
    FLA's ``rms_norm_gated``. The mean runs over the last dim D, or over each
    contiguous group of ``group_size`` elements of it (Mamba2's ``ngroups``). ``eps`` is
    added to the mean square inside the square root (as FLA and Mamba). ``weight``
    multiplies the normalized value before the gate (FLA's order; the same value up to
    fp32 rounding as Qwen3-Next's reference ``weight * norm(x) * silu(z)``). No bias (FLA's
    and Mamba's gated RMSNorm modules carry none). All math runs in fp32 with no rounding
    in between (as FLA's and Mamba's kernels; HF's eager Qwen3-Next reference rounds
    ``norm(x)`` to x's dtype first); ``y`` is stored once in x's dtype. ``sigmoid`` is
    evaluated from ``exp(-|z|)``, so no z overflows (z = +-30 and beyond are finite).
    The SiLU path runs the same operations as before ``activation`` existed (same bits).

    Args:
        x: ``[..., D]``, any leading dims (rows = their product, e.g. tokens x heads),
            last dim contiguous; fp32, bf16 or fp16. 1 <= D <= 65536.
        z: the gate, like x (same shape and dtype), last dim contiguous.
        weight: ``[D]``, fp32 or x's dtype, contiguous.
        eps: finite, > 0 (default 1e-6).
        norm_before_gate: the order above (default True, FLA's).
        group_size: G, dividing D (``None``: G = D); the padded row
            ``next_pow2(D // G) * next_pow2(G)`` must be <= 65536.
        activation: the gate, ``"silu"`` (default), ``"swish"`` (the same gate) or
            ``"sigmoid"``; the backward uses the forward's.
        plan: an :class:`RMSNormSiluGateDetPlan` for (D, G) (default:
            ``make_plan(D, x.dtype, device, group_size=G)``).
        workspace: an :class:`RMSNormSiluGateDetWorkspace` for that plan (default:
            allocated per backward).
        dweight_accumulator: optional fp32 ``[D]`` contiguous (like Megatron's
            ``main_grad``). The backward adds dweight into it in the fixed order and
            ``weight`` gets no autograd gradient (``None``).

    Returns:
        ``y`` like x (same shape and dtype, contiguous).

    Gradients: x, z (like x) and weight (weight's dtype, summed in fp32 and cast once).

    Determinism: y, dx, dz and dweight (or the accumulator's contents) are bitwise
    repeatable for equal inputs, plan, hardware and accumulator contents (per-program fp32
    partials, summed in index order; no atomics).

    Raises:
        ValueError: bad shape, dtype, device, stride, eps, group_size, norm_before_gate,
            activation (not ``"silu"``, ``"swish"`` or ``"sigmoid"``), plan, workspace or
            mode, before any allocation or launch; the caller's tensors are not modified.
    """
    return run_autograd(DET_KINDS, x, z, weight, eps, norm_before_gate, group_size,
                        activation, plan, workspace, dweight_accumulator)


def rmsnorm_silu_gate_det_fwd(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                              eps: float = 1e-6, *, norm_before_gate: bool = True,
                              group_size: int | None = None, activation: str = "silu",
                              plan: RMSNormSiluGateDetPlan | None = None,
                              ) -> tuple[torch.Tensor, RMSNormSiluGateDetSavedSet]:
    """Low-level forward without autograd: returns ``(y, saved)``.

    ``y`` is what :func:`rmsnorm_silu_gate_det` returns; ``saved`` is an
    :class:`RMSNormSiluGateDetSavedSet` (x, z, weight, fp32 rstd ``[rows, D // G]``; meta
    with the canonical ``activation``, ``"silu"`` or ``"sigmoid"``) for
    :func:`rmsnorm_silu_gate_det_bwd`, which uses that gate. Arguments (``activation``
    included), math, shapes and errors as in :func:`rmsnorm_silu_gate_det`.
    """
    return run_fwd(DET_KINDS, x, z, weight, eps, norm_before_gate, group_size, activation,
                   plan)


def rmsnorm_silu_gate_det_bwd(dy: torch.Tensor, saved: RMSNormSiluGateDetSavedSet, *,
                              plan: RMSNormSiluGateDetPlan | None = None,
                              workspace: RMSNormSiluGateDetWorkspace | None = None,
                              dweight_accumulator: torch.Tensor | None = None,
                              ) -> RMSNormSiluGateDetGrads:
    """Low-level backward: gradients of x, z and weight from ``dy`` (the gradient of y).

    The gate (``activation``) and the order are the forward's, read from ``saved``.

    Args:
        dy: like x (the saved input: same shape and dtype); any strides.
        saved: the :class:`RMSNormSiluGateDetSavedSet` of :func:`rmsnorm_silu_gate_det_fwd`.
        plan: default: the forward's plan; another must have the same (D, G).
        workspace, dweight_accumulator: as in :func:`rmsnorm_silu_gate_det`.

    Returns:
        :class:`RMSNormSiluGateDetGrads` ``(dx, dz, dweight)``; ``dweight`` is ``None``
        when ``dweight_accumulator`` received it.

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode; a saved set
            whose meta has no valid ``activation``; ``dy`` not of x's shape and dtype; a bad
            accumulator; tensors on different devices; before any launch.
    """
    return run_bwd(DET_KINDS, dy, saved, plan, workspace, dweight_accumulator)
