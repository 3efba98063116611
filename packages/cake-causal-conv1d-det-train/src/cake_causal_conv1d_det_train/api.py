"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the det
causal depthwise conv1d.

Math (Dao-AILab causal-conv1d ``causal_conv1d_fn``; FLA ``ShortConvolution`` /
``causal_conv1d``), per sequence, channel c, position t, with inputs before the sequence
start read from the initial state (or 0)::

    pre[t, c] = bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c]
    y[t, c]   = act(pre[t, c])                    act: identity or SiLU
    final[c, j] = x[L - W + 1 + j, c]            (j < W - 1; the state's tail if L < W - 1)

Backward, with dpre = dy * act'(pre) (pre recomputed from x, not saved)::

    dx[t, c]      = sum_j weight[c, j] * dpre[t + W - 1 - j, c]   (+ dfinal where t is in it)
    dweight[c, j] = sum_t dpre[t, c] * x[t - W + 1 + j, c]
    dbias[c]      = sum_t dpre[t, c]
    dinitial_state: like dx, for the W - 1 positions before each sequence.

dweight / dbias: one fp32 partial per block of ``plan.block_t_bwd`` tokens, then
:func:`cake_core.gemm.ordered_sum` over the blocks in index order; no atomics anywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_cu_seqlens,
    check_dtype,
    check_last_dim_contiguous,
    check_ndim,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.gemm import ordered_sum
from cake_core.triton_utils import is_interpreting, launch_device_check, next_power_of_2
from cake_core.varlen import checked_offsets, offsets_derived, seq_offsets

from cake_causal_conv1d_det_train.kernels.bwd import causal_conv1d_bwd_kernel
from cake_causal_conv1d_det_train.kernels.bwd_once import causal_conv1d_bwd_once_kernel
from cake_causal_conv1d_det_train.kernels.fwd import causal_conv1d_fwd_kernel
from cake_causal_conv1d_det_train.plan import (
    MAX_HIDDEN,
    MAX_KERNEL_SIZE,
    MIN_KERNEL_SIZE,
    CausalConv1dDetPlan,
    make_plan,
)
from cake_causal_conv1d_det_train.saved import (
    CausalConv1dDetSavedSet,
    CausalConv1dDetWorkspace,
    da_once_programs,
    da_scratch_shape,
    max_blocks,
)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: activation name -> the kernels' flag (FLA accepts "swish" as an alias of "silu")
_ACTIVATIONS = {None: 0, "silu": 1, "swish": 1}


class CausalConv1dDetGrads(NamedTuple):
    """Gradients of :func:`causal_conv1d_det_bwd`; ``None`` where there is none.

    dx: ``[B, T, D]`` in x's dtype (contiguous). dweight: ``[D, W]`` in weight's dtype.
    dbias: ``[D]`` in bias's dtype, only with a bias. dinitial_state: ``[N, D, W - 1]`` in
    the initial state's dtype, only with an initial state.
    """

    dx: torch.Tensor
    dweight: torch.Tensor
    dbias: torch.Tensor | None
    dinitial_state: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class ModeClasses:
    """What one mode's entry points are bound to: this package's det classes and custom
    ops (:data:`DET`), or a non-deterministic sibling's
    (``cake_causal_conv1d_nondet_train``, which runs these launches under its own plan,
    saved set, workspace, gradients and custom-op namespace). Not public API.

    Fields: ``mode``; ``plan`` (:class:`CausalConv1dDetPlan` or a subclass carrying
    ``mode``), ``saved``, ``workspace``, ``grads``: the classes the entries take and
    return; ``make_plan``: the plan rule (``None``: this module's :func:`make_plan`,
    looked up per call); ``op_namespace``: the custom ops' namespace (see
    :func:`register_ops`); ``alert``: called before any backward launch (a nondet
    sibling's deterministic-algorithms alert), or ``None``; ``function``: the eager
    autograd Function (a subclass of this module's, named for the mode; ``None``: this
    module's).
    """

    mode: Mode
    plan: type
    saved: type
    workspace: type
    grads: type
    make_plan: Callable | None
    op_namespace: str
    alert: Callable[[], None] | None = None
    function: type | None = None


# ----------------------------------------------------------------------------- checks


def _activation(activation) -> int:
    if not (activation is None or isinstance(activation, str)) or \
            activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return _ACTIVATIONS[activation]


def _dtypes(*ds: torch.dtype) -> tuple[torch.dtype, ...]:
    return tuple(dict.fromkeys(ds))


#: the layouts the input checks name in their messages: FLA's token-major ``x`` (channels
#: last); channel-first ``[B, D, T]`` input, causal-conv1d's ``causal_conv1d_fn``, is not
#: served
X_LAYOUT = ("[B, T, D], FLA's layout; channel-first [B, D, T] (causal-conv1d's "
            "causal_conv1d_fn) is not served")
WEIGHT_LAYOUT = ("[D, W]: one filter of W taps per channel, D being x's last dim (x is "
                 "[B, T, D], FLA's layout; channel-first [B, D, T] is not served)")
STATE_LAYOUT = "[N, D, W - 1]: each sequence's last W - 1 inputs, channel-first, as FLA's"


def _check_inputs(x, weight, bias, activation, cu_seqlens, initial_state, output_final_state,
                  launch=True):
    """All checks of the forward entries; returns ``(device, N, act, offsets)``: offsets the
    int64 CPU sequence offsets (``None`` while torch.compile traces). Reads cu_seqlens'
    values (one host sync) unless torch.compile is tracing or this very tensor, unchanged,
    was checked before (:func:`cake_core.varlen.checked_offsets`). ``launch=False`` (the
    size queries) skips the launch-device check, and reads no values of a meta
    ``cu_seqlens`` (offsets ``None``), so meta tensors are sized."""
    check_tensor(x, "x")
    check_ndim(x, "x", ndim=3, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    B, T, D = x.shape
    if not 1 <= D <= MAX_HIDDEN:
        raise ValueError(f"x: channels D (last dim) must be in [1, {MAX_HIDDEN}], got {D}")
    check_last_dim_contiguous(x, "x")
    check_tensor(weight, "weight")
    if weight.dim() != 2 or weight.shape[0] != D:
        raise ValueError(f"weight: expected shape [{D}, W] ({WEIGHT_LAYOUT}), got "
                         f"{list(weight.shape)}")
    W = weight.shape[1]
    if not MIN_KERNEL_SIZE <= W <= MAX_KERNEL_SIZE:
        raise ValueError(f"weight: kernel size W must be in [{MIN_KERNEL_SIZE}, "
                         f"{MAX_KERNEL_SIZE}], got {W}")
    check_dtype(weight, "weight", _dtypes(torch.float32, x.dtype))
    check_last_dim_contiguous(weight, "weight")
    if bias is not None:
        check_tensor(bias, "bias")
        check_shape(bias, "bias", [D])
        check_dtype(bias, "bias", _dtypes(torch.float32, x.dtype))
        check_last_dim_contiguous(bias, "bias")
    act = _activation(activation)
    if not isinstance(output_final_state, bool):
        raise ValueError(f"output_final_state: expected a bool, got {output_final_state!r}")
    if initial_state is not None:
        check_tensor(initial_state, "initial_state")
    device = check_same_device(("x", x), ("weight", weight), ("bias", bias),
                               ("initial_state", initial_state))
    if launch:
        launch_device_check(device, "x")
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens: packed sequences need B == 1, got B = {B}")
        # no value reads while torch.compile traces; the op checks them before launching
        if torch.compiler.is_compiling() or (not launch and device.type == "meta"):
            check_cu_seqlens(cu_seqlens, T, device, read_values=False)
            offsets = None
        else:
            offsets = checked_offsets(cu_seqlens, T, device)
        N = cu_seqlens.numel() - 1
    else:
        N = B
        offsets = None if torch.compiler.is_compiling() else seq_offsets(None, B, T)
    if initial_state is not None:
        check_shape(initial_state, "initial_state", [N, D, W - 1], layout=STATE_LAYOUT)
        check_dtype(initial_state, "initial_state", (x.dtype,))
    return device, N, act, offsets


def check_call(m: ModeClasses, x, weight, bias, activation, cu_seqlens, initial_state,
               output_final_state, plan, workspace, *, launch: bool = True):
    """Every check of the entry :func:`causal_conv1d_det` for the mode classes ``m``,
    before any allocation or launch: ``(device, N, act, offsets, plan, (wpart, bpart,
    scr))``, or ``ValueError``. The entries and the queries
    (:mod:`cake_causal_conv1d_det_train.queries`) run this one function; ``launch``: as
    :func:`_check_inputs`."""
    device, N, act, offsets = _check_inputs(x, weight, bias, activation, cu_seqlens,
                                            initial_state, output_final_state, launch)
    B, T, D = x.shape
    plan = _resolve_plan(plan, D, weight.shape[1], x.dtype, device, cu_seqlens is not None,
                         workspace, m)
    bufs = _resolve_workspace(workspace, plan, device, B * T, N, m)
    return device, N, act, offsets, plan, bufs


_DEFAULT_PLANS: dict[tuple, CausalConv1dDetPlan] = {}


#: Plan fields only the forward reads (the rule's fixed-length and packed plans differ in
#: these alone on CUDA).
FORWARD_FIELDS = ("block_t_fwd", "block_d_fwd", "num_warps_fwd", "fwd_sub_t", "fwd_sub_t_linear")


def adopt_workspace_plan(plan: CausalConv1dDetPlan, workspace) -> CausalConv1dDetPlan:
    """``plan`` chosen by default, or the plan of ``workspace`` (a
    :class:`CausalConv1dDetWorkspace` or one that nests it, with ``.plan``) when the two
    differ in :data:`FORWARD_FIELDS` only: the workspace's buffers are the same and the
    backward's bits too, so a workspace made for the fixed-length plan serves a packed call
    whose default plan is the packed one. A workspace of a plan that differs elsewhere is
    left to the workspace check, which refuses it."""
    got = getattr(workspace, "plan", None)
    if not isinstance(got, CausalConv1dDetPlan) or got == plan or got.mode != plan.mode:
        return plan
    a, b = got.to_dict(), plan.to_dict()
    for name in FORWARD_FIELDS:
        a.pop(name)
        b.pop(name)
    return got if a == b else plan


def _resolve_plan(plan, D: int, W: int, dtype: torch.dtype, device: torch.device,
                  varlen: bool = False, workspace=None, m: ModeClasses | None = None,
                  ) -> CausalConv1dDetPlan:
    """The call's plan: ``plan``; else the rule's (:func:`make_plan` with ``varlen``), or
    the workspace's plan where that differs from it in forward fields only
    (:func:`adopt_workspace_plan`). ``m``: the mode's classes (default :data:`DET`)."""
    m = m or DET
    if plan is None:
        key = (m.mode, D, W, dtype, device, varlen)
        plan = _DEFAULT_PLANS.get(key)
        if plan is None:
            plan = (m.make_plan or make_plan)(D, W, dtype, device, varlen=varlen)
            if not torch.compiler.is_compiling():
                _DEFAULT_PLANS[key] = plan
        return adopt_workspace_plan(plan, workspace) if workspace is not None else plan
    require_mode(plan, m.plan, m.mode, name="plan")
    if (plan.hidden_size, plan.kernel_size) != (D, W):
        raise ValueError(f"plan: made for hidden_size={plan.hidden_size}, "
                         f"kernel_size={plan.kernel_size}; inputs have D={D}, W={W}")
    return plan


def _resolve_workspace(workspace, plan: CausalConv1dDetPlan, device: torch.device,
                       n_tokens: int, n_seqs: int, m: ModeClasses | None = None):
    """``(dweight_partials, dbias_partials, da_scratch)`` of a checked workspace (the last
    None unless ``plan.bwd_da_once``), or ``(None, None, None)``. The capacity asked is
    :func:`max_blocks` of the call's token and sequence counts (reads no cu_seqlens
    values). ``m``: the mode's classes (default :data:`DET`)."""
    if workspace is None:
        return None, None, None
    m = m or DET
    require_mode(workspace, m.workspace, m.mode, name="workspace")
    ws_name = m.workspace.__name__
    workspace.check(plan, device)
    D, W = plan.hidden_size, plan.kernel_size
    need = max_blocks(n_tokens, n_seqs, plan.block_t_bwd)
    want = {"dweight_partials": (D, W), "dbias_partials": (D,)}
    bufs = []
    for name, tail in want.items():
        t = workspace[name] if name in workspace.names else None
        if t is None or t.dtype != torch.float32 or not t.is_contiguous() or \
                t.dim() != 1 + len(tail) or tuple(t.shape[1:]) != tail:
            raise ValueError(
                f"workspace: buffer {name!r} must be a contiguous fp32 tensor of shape "
                f"[*, {', '.join(map(str, tail))}]; build it with "
                f"{ws_name}.for_plan(plan, device, max_tokens=..., max_seqs=...)")
        if t.shape[0] < need:
            raise ValueError(f"workspace: {name!r} holds {t.shape[0]} token blocks, the call "
                             f"may need {need} ({n_tokens} tokens in {n_seqs} sequences)")
        bufs.append(t)
    scr = None
    if plan.bwd_da_once:
        scr = workspace["da_scratch"] if "da_scratch" in workspace.names else None
        tail = da_scratch_shape(plan, 1)[1:]
        if scr is None or scr.dtype != torch.float32 or not scr.is_contiguous() or \
                scr.dim() != 3 or tuple(scr.shape[1:]) != tail or scr.shape[0] < 1:
            raise ValueError(
                "workspace: buffer 'da_scratch' must be a contiguous fp32 tensor of shape "
                f"[programs, {', '.join(map(str, tail))}]; build it with "
                f"{ws_name}.for_plan(plan, device, max_tokens=..., max_seqs=...)")
    return bufs[0], bufs[1], scr


# ----------------------------------------------------------------------------- launches


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block_table(offsets: torch.Tensor, block_t: int) -> torch.Tensor:
    """int32 CPU ``[n_blocks, 2]``: (sequence, first token in it) of each block of
    ``block_t`` tokens, sequences in order, blocks of a sequence in order. Every sequence
    has at least one block (an empty one: a block of masked rows, whose program writes the
    sequence's final state / d(initial_state) and a zero partial)."""
    lens = offsets[1:] - offsets[:-1]
    per_seq = ((lens + block_t - 1) // block_t).clamp_(min=1)
    seq = torch.repeat_interleave(torch.arange(per_seq.numel(), dtype=torch.int64), per_seq)
    first = torch.zeros(per_seq.numel() + 1, dtype=torch.int64)
    first[1:] = torch.cumsum(per_seq, 0)
    local = torch.arange(seq.numel(), dtype=torch.int64) - first[:-1][seq]
    return torch.stack([seq, local * block_t], 1).to(torch.int32)


def _blocks(x, cu_seqlens, offsets, block_t: int):
    """``(n_blocks, n_blk_seq, table, cu)`` of a launch: fixed length walks
    B * max(1, cdiv(T, bt)) blocks arithmetically (``cu`` is x: never read); packed
    sequences use a (sequence, start) table on x's device and ``cu``, the checked
    ``offsets`` copied to x's device (contiguous int64: the kernels read ``CU + n``, so
    never the caller's tensor, which may be strided or changed since its check), both
    built once per checked cu_seqlens version, block size, device and (CUDA) stream
    (:func:`cake_core.varlen.offsets_derived`; read-only)."""
    B, T = x.shape[:2]
    if cu_seqlens is None:
        nbs = max(_cdiv(T, block_t), 1)
        return B * nbs, nbs, None, x
    dev = x.device
    # the stream the table is copied on: a table is only reused on its own stream (its
    # copy is ordered before the launches, and its memory is freed on the stream that read it)
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None

    def build():
        table = _block_table(offsets, block_t)
        return (table.shape[0], table.to(dev, non_blocking=True),
                offsets.to(dev, torch.int64, non_blocking=True, copy=True))

    n, table, cu = offsets_derived(cu_seqlens, offsets,
                                   ("cake_causal_conv1d_det_train.block_table", block_t, dev,
                                    stream), build)
    return n, 1, table, cu


def _h0_strides(h0) -> tuple[int, int, int]:
    return tuple(h0.stride()) if h0 is not None else (0, 0, 0)


def _rne(dtype: torch.dtype) -> bool:
    """Round bf16 outputs by hand: the interpreter's fp32 -> bf16 cast truncates."""
    return dtype == torch.bfloat16 and is_interpreting()


def _kernel_weight(weight: torch.Tensor, plan: CausalConv1dDetPlan):
    """``(tensor, (channel stride, tap stride))`` the kernels read the taps from: the
    ``[D, W]`` weight itself, or with ``plan.weight_tap_major`` a ``[W, D]`` contiguous copy
    (each tap's channels contiguous: vector loads; the same values, so the same bits)."""
    if plan.weight_tap_major:
        wt = weight.t().contiguous()
        return wt, (wt.stride(1), wt.stride(0))
    return weight, (weight.stride(0), 1)  # last dim contiguous (checked), W >= 2


def _launch_fwd(x, weight, bias, h0, cu_seqlens, offsets, act: int, output_final_state: bool,
                plan: CausalConv1dDetPlan):
    B, T, D = x.shape
    W = weight.shape[1]
    N = offsets.numel() - 1
    y = torch.empty((B, T, D), dtype=x.dtype, device=x.device)
    fs = torch.empty((N, D, W - 1), dtype=x.dtype, device=x.device) if output_final_state \
        else None
    nb, nbs, table, cu = _blocks(x, cu_seqlens, offsets, plan.block_t_fwd)
    if nb:
        wt, w_strides = _kernel_weight(weight, plan)
        causal_conv1d_fwd_kernel[(nb, _cdiv(D, plan.block_d_fwd))](
            x, wt, bias if bias is not None else weight, h0 if h0 is not None else x, y,
            fs if fs is not None else y, table if table is not None else cu, cu,
            T, D, nbs, x.stride(0), x.stride(1), *w_strides, *_h0_strides(h0),
            W=W, BW=next_power_of_2(W), SILU=bool(act), HAS_BIAS=bias is not None,
            HAS_H0=h0 is not None, HAS_FS=fs is not None, VARLEN=cu_seqlens is not None,
            RNE=_rne(x.dtype), BLOCK_T=plan.block_t_fwd, BLOCK_D=plan.block_d_fwd,
            SUB_T=min(plan.block_t_fwd, plan.fwd_sub_t if act else plan.fwd_sub_t_linear),
            num_warps=plan.num_warps_fwd)
    return y, fs


def _sum_partials(partials: torch.Tensor, dtype: torch.dtype, plan: CausalConv1dDetPlan):
    """The partials summed over dim 0 in index order, cast once to ``dtype``."""
    out = torch.empty(partials.shape[1:], dtype=dtype, device=partials.device)
    if _rne(dtype):  # the interpreter's in-kernel bf16 cast truncates: cast on the host
        tmp = torch.empty(partials.shape[1:], dtype=torch.float32, device=partials.device)
        ordered_sum(partials, out=tmp, block=plan.reduce_block,
                    num_warps=plan.num_warps_reduce)
        return out.copy_(tmp)
    return ordered_sum(partials, out=out, block=plan.reduce_block,
                       num_warps=plan.num_warps_reduce)


def _launch_bwd(dy, dht, x, weight, bias, h0, cu_seqlens, offsets, act: int,
                plan: CausalConv1dDetPlan, wpart=None, bpart=None, scr=None):
    """Returns ``(dx, dweight, dbias or None, dinitial_state or None)``. ``dy``: last dim
    contiguous. ``wpart`` / ``bpart``: workspace buffers (leading rows used) or None;
    ``scr``: the workspace's ``da_scratch`` (``plan.bwd_da_once`` with SiLU; its leading
    dim is the program count) or None (allocated here)."""
    B, T, D = x.shape
    W = weight.shape[1]
    N = offsets.numel() - 1
    dev = x.device
    dx = torch.empty((B, T, D), dtype=x.dtype, device=dev)
    dh0 = torch.empty((N, D, W - 1), dtype=h0.dtype, device=dev) if h0 is not None else None
    nb, nbs, table, cu = _blocks(x, cu_seqlens, offsets, plan.block_t_bwd)
    f32 = torch.float32
    wpart = wpart[:nb] if wpart is not None else torch.empty((nb, D, W), dtype=f32, device=dev)
    if bias is not None:
        bpart = bpart[:nb] if bpart is not None else torch.empty((nb, D), dtype=f32, device=dev)
    ts = tuple(dht.stride()) if dht is not None else (0, 0, 0)
    if nb and act and plan.bwd_da_once:  # SiLU only: without it dpre is dy, nothing repeats
        wt, w_strides = _kernel_weight(weight, plan)
        n_cb = _cdiv(D, plan.block_d_bwd)
        if scr is None:
            scr = torch.empty(da_scratch_shape(plan, da_once_programs(dev)), dtype=f32,
                              device=dev)
        causal_conv1d_bwd_once_kernel[(min(nb * n_cb, scr.shape[0]),)](
            x, wt, bias if bias is not None else weight, h0 if h0 is not None else x,
            dy, dht if dht is not None else dy, dx, dh0 if dh0 is not None else dx, wpart,
            bpart if bias is not None else wpart, table if table is not None else cu, cu, scr,
            T, D, nbs, n_cb, nb * n_cb, x.stride(0), x.stride(1), *w_strides,
            *_h0_strides(h0), dy.stride(0), dy.stride(1), *ts,
            W=W, BW=next_power_of_2(W), HAS_BIAS=bias is not None, HAS_H0=h0 is not None,
            HAS_DHT=dht is not None, VARLEN=cu_seqlens is not None, RNE=_rne(x.dtype),
            BLOCK_T=plan.block_t_bwd, BLOCK_D=plan.block_d_bwd, num_warps=plan.num_warps_bwd)
    elif nb:
        wt, w_strides = _kernel_weight(weight, plan)
        causal_conv1d_bwd_kernel[(nb, _cdiv(D, plan.block_d_bwd))](
            x, wt, bias if bias is not None else weight, h0 if h0 is not None else x,
            dy, dht if dht is not None else dy, dx, dh0 if dh0 is not None else dx, wpart,
            bpart if bias is not None else wpart, table if table is not None else cu, cu,
            T, D, nbs, x.stride(0), x.stride(1), *w_strides, *_h0_strides(h0),
            dy.stride(0), dy.stride(1), *ts,
            W=W, BW=next_power_of_2(W), SILU=bool(act), HAS_BIAS=bias is not None,
            HAS_H0=h0 is not None, HAS_DHT=dht is not None, VARLEN=cu_seqlens is not None,
            RNE=_rne(x.dtype), BLOCK_T=plan.block_t_bwd, BLOCK_D=plan.block_d_bwd,
            WINDOW=plan.bwd_window, num_warps=plan.num_warps_bwd)
    dweight = _sum_partials(wpart, weight.dtype, plan)
    dbias = _sum_partials(bpart, bias.dtype, plan) if bias is not None else None
    return dx, dweight, dbias, dh0


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


# ----------------------------------------------------------------------------- custom ops
# What torch.compile traces (the eager entry keeps _CausalConv1dDetFunction: less host
# time, same launches, same bits). The plan crosses as its int fields; outputs that may not
# exist (final state, dbias, dinitial_state) are empty tensors ``[0]``. The workspace's
# partial buffers cross the ops; ``bwd_da_once``'s dpre scratch does not (allocated per
# backward there, as without a workspace).


def _empty0(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


def _op_offsets(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """The ops' int64 CPU offsets; cu_seqlens' values checked (before any launch) unless
    this very tensor, unchanged, was checked before."""
    B, T = x.shape[:2]
    if cu_seqlens is None:
        return seq_offsets(None, B, T)
    return checked_offsets(cu_seqlens, T, x.device)


def register_ops(m: ModeClasses):
    """Register ``<m.op_namespace>::fwd`` / ``::bwd`` (what torch.compile traces) with their
    fake implementations and the autograd formula, for the plans of ``m.plan`` carrying
    ``m.mode``; ``m.alert`` (if any) runs in the backward before any launch. Returns the
    two ops. This package registers :data:`DET`'s at import; a nondet sibling its own."""
    ns = m.op_namespace

    @torch.library.custom_op(f"{ns}::fwd", mutates_args=())
    def _fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, act: int,
                output_final_state: bool, plan_fields: list[int],
                dweight_partials: torch.Tensor | None, dbias_partials: torch.Tensor | None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, final_state or [0])``; arguments checked by the entry, except the values of
        cu_seqlens (checked here, before any launch). The partial buffers are only carried
        to the backward."""
        plan = plan_from_op_fields(m.plan, plan_fields, m.mode)
        y, fs = _launch_fwd(x, weight, bias, initial_state, cu_seqlens,
                            _op_offsets(x, cu_seqlens), act, output_final_state, plan)
        return y, (fs if fs is not None else _empty0(x))

    @_fwd_op.register_fake
    def _fwd_fake(x, weight, bias, initial_state, cu_seqlens, act, output_final_state,
                  plan_fields, dweight_partials, dbias_partials):
        B, T, D = x.shape
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        W = weight.shape[1]
        fs = x.new_empty((N, D, W - 1) if output_final_state else (0,))
        return x.new_empty((B, T, D)), fs

    @torch.library.custom_op(f"{ns}::bwd", mutates_args=("dweight_partials", "dbias_partials"))
    def _bwd_op(dy: torch.Tensor, dfinal_state: torch.Tensor | None, x: torch.Tensor,
                weight: torch.Tensor, bias: torch.Tensor | None,
                initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None, act: int,
                plan_fields: list[int], dweight_partials: torch.Tensor | None,
                dbias_partials: torch.Tensor | None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dx, dweight, dbias or [0], dinitial_state or [0])``."""
        if m.alert is not None:
            m.alert()
        plan = plan_from_op_fields(m.plan, plan_fields, m.mode)
        dx, dw, db, dh0 = _launch_bwd(_last_dim_contiguous(dy), dfinal_state, x, weight, bias,
                                      initial_state, cu_seqlens, _op_offsets(x, cu_seqlens),
                                      act, plan, dweight_partials, dbias_partials)
        return (dx, dw, db if db is not None else _empty0(x),
                dh0 if dh0 is not None else _empty0(x))

    @_bwd_op.register_fake
    def _bwd_fake(dy, dfinal_state, x, weight, bias, initial_state, cu_seqlens, act,
                  plan_fields, dweight_partials, dbias_partials):
        db = bias.new_empty(bias.shape) if bias is not None else x.new_empty((0,))
        dh0 = initial_state.new_empty(initial_state.shape) if initial_state is not None else \
            x.new_empty((0,))
        return x.new_empty(x.shape), weight.new_empty(weight.shape), db, dh0

    def _setup_context(ctx, inputs, output):
        (x, weight, bias, initial_state, cu_seqlens, act, output_final_state, plan_fields,
         wpart, bpart) = inputs
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, wpart, bpart)
        ctx.act, ctx.output_final_state, ctx.plan_fields = act, output_final_state, plan_fields

    def _backward(ctx, dy, dfs):
        if m.alert is not None:
            m.alert()
        x, weight, bias, h0, cu, wpart, bpart = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        dfs = dfs if ctx.output_final_state else None
        dx, dw, db, dh0 = _bwd_op(dy, dfs, x, weight, bias, h0, cu, ctx.act, ctx.plan_fields,
                                  wpart, bpart)
        need = ctx.needs_input_grad
        return (dx, dw if need[1] else None, db if bias is not None and need[2] else None,
                dh0 if h0 is not None and need[3] else None, None, None, None, None, None,
                None)

    _fwd_op.register_autograd(_backward, setup_context=_setup_context)
    return _fwd_op, _bwd_op


class _CausalConv1dDetFunction(torch.autograd.Function):
    """Eager autograd (lower host overhead than the custom ops; same launches, same bits).
    The saved set's tensors go through ``ctx.save_for_backward`` (checkpointing and
    saved-tensor hooks work); the CPU offsets and the workspace buffers are ctx attributes
    (host metadata / scratch overwritten by each backward). ``alert``: called before the
    backward launches (a nondet sibling's), or None."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, cu_seqlens, offsets, act,
                output_final_state, plan, wpart, bpart, scr, alert):
        y, fs = _launch_fwd(x, weight, bias, initial_state, cu_seqlens, offsets, act,
                            output_final_state, plan)
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens)
        ctx.offsets, ctx.act, ctx.plan, ctx.wpart, ctx.bpart = offsets, act, plan, wpart, bpart
        ctx.scr, ctx.alert = scr, alert
        ctx.output_final_state = output_final_state
        return y, fs

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dfs):
        if ctx.alert is not None:
            ctx.alert()
        x, weight, bias, h0, cu = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        dx, dw, db, dh0 = _launch_bwd(_last_dim_contiguous(dy),
                                      dfs if ctx.output_final_state else None, x, weight,
                                      bias, h0, cu, ctx.offsets, ctx.act, ctx.plan, ctx.wpart,
                                      ctx.bpart, ctx.scr)
        need = ctx.needs_input_grad
        return (dx, dw if need[1] else None, db if need[2] else None,
                dh0 if need[3] else None, None, None, None, None, None, None, None, None, None)


#: this package's mode classes and custom ops
DET = ModeClasses(Mode.DET, CausalConv1dDetPlan, CausalConv1dDetSavedSet,
                  CausalConv1dDetWorkspace, CausalConv1dDetGrads, None,
                  "cake_causal_conv1d_det_train")
_fwd_op, _bwd_op = register_ops(DET)


# ----------------------------------------------------------------------------- public API


def causal_conv1d_det(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      *, activation: str | None = None, cu_seqlens: torch.Tensor | None = None,
                      initial_state: torch.Tensor | None = None,
                      output_final_state: bool = False,
                      plan: CausalConv1dDetPlan | None = None,
                      workspace: CausalConv1dDetWorkspace | None = None):
    """Deterministic causal depthwise conv1d with autograd (FLA ``causal_conv1d`` /
    Dao-AILab ``causal_conv1d_fn`` semantics, token-major layout).

    ``y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c])`` within each
    sequence; positions before a sequence start read ``initial_state`` (or 0), never the
    previous sequence.

    Args:
        x: ``[B, T, D]`` (fixed length), or ``[1, T, D]`` packed with ``cu_seqlens``;
            fp32, bf16 or fp16; channels contiguous (stride 1), any batch/time strides.
            1 <= D <= 2**20 (any D); T = 0 allowed.
        weight: ``[D, W]``, 2 <= W <= 8, fp32 or x's dtype, last dim contiguous
            (``ShortConvolution`` passes its ``[D, 1, W]`` weight viewed as ``[D, W]``).
        bias: ``[D]`` (fp32 or x's dtype) or None.
        activation: None, ``"silu"`` or ``"swish"`` (an alias of silu, as in FLA).
        cu_seqlens: int32/int64 ``[N + 1]`` offsets of N packed sequences (B must be 1):
            starting at 0, non-decreasing, ending at T; empty sequences allowed. Its values
            are read on the host (one sync; not again on later calls with the same
            tensor while unchanged: :func:`cake_core.varlen.checked_offsets`).
        initial_state: ``[N, D, W - 1]`` in x's dtype (N = B, or the number of sequences),
            any strides: slot k holds the input at position k - (W - 1) before the sequence
            start. (FLA's cache is ``[N, D, W]``; its slots 1..W-1 are this state.)
        output_final_state: also return ``final_state`` ``[N, D, W - 1]`` in x's dtype:
            each sequence's last W - 1 inputs (left-padded with the tail of its initial
            state, or zeros, when it is shorter than W - 1). Exact copies of the inputs.
        plan: a :class:`CausalConv1dDetPlan` for (D, W) (default: :func:`make_plan` with
            ``varlen`` set when ``cu_seqlens`` is, or the workspace's plan where that differs
            from it in the forward's fields only, :func:`adopt_workspace_plan`).
        workspace: a :class:`CausalConv1dDetWorkspace` of ``plan`` for the backward's fp32
            partials (default: allocated per backward).

    Returns:
        ``(y, final_state)``: y ``[B, T, D]`` contiguous in x's dtype (computed in fp32);
        final_state as above, or None without ``output_final_state``. Gradients flow to x,
        weight, bias and initial_state, including the gradient that reaches final_state;
        bitwise repeatable for equal inputs, upstream gradients, plan and hardware. Not
        twice differentiable.

    Raises:
        ValueError: before any allocation or launch, naming the argument: a non-tensor,
            wrong rank / shape / dtype, D or W out of range, non-contiguous channels,
            tensors on different devices or on one the backend cannot run,
            ``cu_seqlens`` with B > 1 or values that are not sorted offsets ending at T,
            an unknown activation, a plan / workspace of another type, mode or shape.

    Under ``torch.compile`` (``fullgraph=True`` works) the call becomes the custom ops
    ``cake_causal_conv1d_det_train::fwd`` / ``::bwd`` (same kernels, same bits); the values
    of ``cu_seqlens`` are then checked when the op runs, not while tracing.
    """
    return conv_call(DET, x, weight, bias, activation, cu_seqlens, initial_state,
                     output_final_state, plan, workspace)


def conv_call(m: ModeClasses, x, weight, bias, activation, cu_seqlens, initial_state,
              output_final_state, plan, workspace):
    """:func:`causal_conv1d_det`'s body for the mode classes ``m`` (also a nondet
    sibling's autograd entry)."""
    _, _, act, offsets, plan, (wpart, bpart, scr) = check_call(
        m, x, weight, bias, activation, cu_seqlens, initial_state, output_final_state, plan,
        workspace)
    if not torch.compiler.is_compiling():
        return (m.function or _CausalConv1dDetFunction).apply(
            x, weight, bias, initial_state, cu_seqlens, offsets, act,
            output_final_state, plan, wpart, bpart, scr, m.alert)
    y, fs = getattr(torch.ops, m.op_namespace).fwd(
        x, weight, bias, initial_state, cu_seqlens, act, output_final_state,
        plan_to_op_fields(plan), wpart, bpart)
    return y, (fs if output_final_state else None)


def causal_conv1d_det_fwd(x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None = None, *, activation: str | None = None,
                          cu_seqlens: torch.Tensor | None = None,
                          initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False,
                          plan: CausalConv1dDetPlan | None = None):
    """Low-level forward of :func:`causal_conv1d_det` (no autograd).

    Arguments, shapes, dtypes and errors as :func:`causal_conv1d_det` (the workspace
    belongs to :func:`causal_conv1d_det_bwd`).

    Returns:
        ``(y, final_state, saved)``: ``final_state`` is None without
        ``output_final_state``; ``saved`` a :class:`CausalConv1dDetSavedSet` (x, weight,
        bias, initial_state, cu_seqlens; the pre-activation is recomputed by the backward).
    """
    return fwd_call(DET, x, weight, bias, activation, cu_seqlens, initial_state,
                    output_final_state, plan)


def fwd_call(m: ModeClasses, x, weight, bias, activation, cu_seqlens, initial_state,
             output_final_state, plan):
    """:func:`causal_conv1d_det_fwd`'s body for the mode classes ``m``."""
    _, N, act, offsets, plan, _ = check_call(m, x, weight, bias, activation, cu_seqlens,
                                             initial_state, output_final_state, plan, None)
    with torch.no_grad():
        y, fs = _launch_fwd(x, weight, bias, initial_state, cu_seqlens, offsets, act,
                            output_final_state, plan)
    saved = m.saved(
        m.mode, {"x": x, "weight": weight, "bias": bias, "initial_state": initial_state,
                   "cu_seqlens": cu_seqlens},
        meta={"activation": "silu" if act else None, "plan": plan, "offsets": offsets,
              "n_seqs": N})
    return y, fs, saved


def causal_conv1d_det_bwd(dy: torch.Tensor, dfinal_state: torch.Tensor | None,
                          saved: CausalConv1dDetSavedSet, *,
                          plan: CausalConv1dDetPlan | None = None,
                          workspace: CausalConv1dDetWorkspace | None = None
                          ) -> CausalConv1dDetGrads:
    """Low-level backward of :func:`causal_conv1d_det_fwd`.

    Recomputes the pre-activation from the saved inputs (with SiLU), then per tile dx and
    one fp32 partial dweight / dbias per block of ``plan.block_t_bwd`` tokens, summed over
    the blocks in index order (:func:`cake_core.gemm.ordered_sum`), cast once to weight's /
    bias's dtype; d(initial_state) by one program per (sequence, channel block). No atomics.

    Args:
        dy: gradient of y, ``[B, T, D]``, fp32/bf16/fp16, channels contiguous.
        dfinal_state: gradient of final_state, ``[N, D, W - 1]``, fp32/bf16/fp16 (any
            strides), or None (zero). It reaches dx (a sequence's last W - 1 tokens) and,
            for sequences shorter than W - 1, dinitial_state.
        saved: the :class:`CausalConv1dDetSavedSet` of the forward.
        plan: default: the forward's (``saved.plan``), or the workspace's plan where that
            differs from it in the forward's fields only (:data:`FORWARD_FIELDS`; the same
            backward). workspace: a :class:`CausalConv1dDetWorkspace` of ``plan`` holding at
            least ``max_blocks(B * T, N, plan.block_t_bwd)`` rows.

    Returns:
        :class:`CausalConv1dDetGrads` ``(dx, dweight, dbias, dinitial_state)``.

    Raises:
        ValueError: a saved set of another type or mode; dy / dfinal_state of the wrong
            shape, dtype, layout or device; a plan or workspace of another type, mode or
            shape, or a workspace too small; before any launch.
    """
    return bwd_call(DET, dy, dfinal_state, saved, plan, workspace)


def bwd_call(m: ModeClasses, dy, dfinal_state, saved, plan, workspace):
    """:func:`causal_conv1d_det_bwd`'s body for the mode classes ``m`` (``m.alert`` runs
    after the checks, before any launch)."""
    require_mode(saved, m.saved, m.mode, name="saved")
    x, weight = saved.x, saved.weight
    B, T, D = x.shape
    W = weight.shape[1]
    N = saved.n_seqs
    check_tensor(dy, "dy")
    check_shape(dy, "dy", [B, T, D], layout=X_LAYOUT)
    check_dtype(dy, "dy", _FLOATS)
    check_last_dim_contiguous(dy, "dy")
    if dfinal_state is not None:
        check_tensor(dfinal_state, "dfinal_state")
        check_shape(dfinal_state, "dfinal_state", [N, D, W - 1], layout=STATE_LAYOUT)
        check_dtype(dfinal_state, "dfinal_state", _FLOATS)
    device = check_same_device(("saved", x), ("dy", dy), ("dfinal_state", dfinal_state))
    launch_device_check(device, "dy")
    if plan is None:  # the forward's, or the workspace's where it differs in forward fields
        plan = adopt_workspace_plan(saved.plan, workspace) \
            if isinstance(saved.plan, CausalConv1dDetPlan) else saved.plan
    plan = _resolve_plan(plan, D, W, x.dtype, device, m=m)
    wpart, bpart, scr = _resolve_workspace(workspace, plan, device, B * T, N, m)
    if m.alert is not None:
        m.alert()
    with torch.no_grad():
        dx, dw, db, dh0 = _launch_bwd(dy, dfinal_state, x, weight, saved.bias,
                                      saved.initial_state, saved.cu_seqlens, saved.offsets,
                                      _ACTIVATIONS[saved.activation], plan, wpart, bpart, scr)
    return m.grads(dx, dw, db, dh0)
