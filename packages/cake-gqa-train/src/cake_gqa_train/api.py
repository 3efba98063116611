"""Autograd entry, low-level forward / backward and flash-attn's entry points of
non-deterministic grouped-query attention.

The math and the forward are cake-gqa-det-train's (:mod:`cake_gqa_det_train.reference`);
the backward computes dK and dV per query head and, where several query heads share a KV
head (GQA), sums them with fp32 atomic adds, so its bits may change from run to run. Under
``torch.use_deterministic_algorithms(True)`` the backward raises ``RuntimeError`` before
any launch (with ``warn_only=True`` it warns once and runs); use
``cake_gqa_det_train.gqa_det`` for repeatable gradients.
"""

from __future__ import annotations

import torch
from cake_core import Mode, nondet_alert, require_mode
from cake_core.autograd import once_differentiable
from cake_core.compile import custom_op, op_or_body, plan_from_op_fields, plan_to_op_fields
from cake_core.triton_utils import cdiv
from cake_gqa_det_train.entry import (
    check_fa_batched,
    check_fa_varlen,
    checked_dout,
    distinct,
    fa_flag,
    forward_saved,
    lastc,
    packed,
    refuse_fa_options,
    resolve_plan,
    unpacked,
)
from cake_gqa_det_train.inputs import Problem, check_call, resolve_op_ints
from cake_gqa_det_train.kernels.bwd import gqa_bwd_dkdv_kernel
from cake_gqa_det_train.launch import (
    bwd_common,
    bwd_inputs,
    bwd_prologue,
    launch_dq,
    launch_fwd,
)

from cake_gqa_train.kernels.bwd import gqa_bwd_dkdv_atomic_kernel
from cake_gqa_train.plan import GQAPlan, make_plan
from cake_gqa_train.saved import GQASavedSet, GQAWorkspace

_OP = "cake_gqa_train"
_empty = torch.empty


def _deterministic_alert() -> None:
    """RuntimeError under ``torch.use_deterministic_algorithms(True)``; with
    ``warn_only=True`` one warning per process, then the backward runs."""
    nondet_alert("cake_gqa_train's backward (dK / dV summed with floating atomic adds)",
                 "cake_gqa_det_train.gqa_det (or its flash_attn_func / flash_attn_varlen_func)")


def _resolve_plan(plan, D: int, dtype, device) -> GQAPlan:
    return resolve_plan(plan, GQAPlan, Mode.NONDET, D, dtype, device, make_plan)


def _resolve_workspace(workspace, plan: GQAPlan, device, prob: Problem):
    if workspace is None:
        return None, None
    require_mode(workspace, GQAWorkspace, Mode.NONDET, name="workspace")
    workspace.check(plan, device)
    need = {"delta": prob.heads_q * prob.n_tok_q,
            "dkv_accum": 2 * prob.n_tok_k * prob.heads_kv * prob.head_dim}
    for name, n in need.items():
        if name not in workspace.names:
            raise ValueError(f"workspace: no {name!r} buffer; build it with "
                             "GQAWorkspace.for_plan")
        buf = workspace[name]
        if buf.dtype != torch.float32 or buf.dim() != 1 or not buf.is_contiguous() \
                or buf.numel() < n:
            raise ValueError(
                f"workspace: {name!r} must be a contiguous 1-D fp32 tensor of at least {n} "
                f"values, got {str(buf.dtype)[6:]} {list(buf.shape)}; build it with "
                f"GQAWorkspace.for_plan(plan, device, num_heads={prob.heads_q}, "
                f"max_tokens={prob.n_tok_q}, num_kv_heads={prob.heads_kv}, "
                f"max_kv_tokens={prob.n_tok_k})")
    return workspace["delta"], workspace["dkv_accum"]


def checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size, softcap, return_lse, plan, workspace, *,
            meta_ok: bool = False) -> tuple:
    """Every check of :func:`gqa` (``ValueError``), nothing launched or allocated; run by
    gqa, ``is_supported`` and ``saved_bytes``. Returns ``(problem, plan, (delta,
    dkv_accum))``, the workspace's buffers or Nones. ``meta_ok``: as
    ``cake_gqa_det_train.inputs.check_call``."""
    prob, device = check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, softmax_scale, causal, window_size, softcap,
                              meta_ok=meta_ok)
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse: expected a bool, got {return_lse!r}")
    plan = _resolve_plan(plan, prob.head_dim, q.dtype, device)
    return prob, plan, _resolve_workspace(workspace, plan, device, prob)


def launch_bwd(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale: float, softcap: float,
               plan: GQAPlan, delta=None, dkv_accum=None):
    """-> (dq, dk, dv): dK / dV per query head, summed over a KV head's query heads by fp32
    atomic adds (GQA; ``plan.bwd_atomic``), else by cake-gqa-det-train's kernel; dQ by
    cake-gqa-det-train's kernel. ``dkv_accum``: a workspace's
    fp32 buffer of at least ``2 * Tk * Hkv * D`` values, or ``None``."""
    _, _, n_docs, max_q, max_k, _, _ = ints
    Tq, Hq, D = q.shape
    Tk, Hkv, _ = k.shape
    dev = q.device
    group = Hq // Hkv
    dq = _empty((Tq, Hq, D), dtype=q.dtype, device=dev)
    if Tq == 0 or n_docs == 0 or max_q <= 0:
        return dq, torch.zeros_like(k), torch.zeros_like(v)
    # each program owns its rows (one query head per KV head, or the det kernel): stored
    # directly in k's / v's dtype
    direct = group == 1 or not plan.bwd_atomic
    if direct:
        dk, dv = (_empty((Tk, Hkv, D), dtype=t.dtype, device=dev) for t in (k, v))
    elif dkv_accum is None:
        dk, dv = torch.zeros((2, Tk, Hkv, D), dtype=torch.float32, device=dev).unbind(0)
    else:
        dk, dv = dkv_accum[: 2 * Tk * Hkv * D].view(2, Tk, Hkv, D).zero_().unbind(0)
    delta, cu_q, cu_k, flags = bwd_prologue(out, dout, lse, cu_q, cu_k, ints, softcap, plan,
                                            delta)
    q, k, v, dout = bwd_inputs(q, k, v, dout)
    common = bwd_common(q, k, v, dout, ints, scale, softcap)
    if Tk > 0 and max_k > 0:
        kernel, heads = ((gqa_bwd_dkdv_atomic_kernel, Hq) if plan.bwd_atomic
                         else (gqa_bwd_dkdv_kernel, Hkv))
        kernel[(cdiv(max_k, plan.bwd_block_n), heads, n_docs)](
            q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, *common,
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            GROUP=group, D=D, BLOCK_M=plan.bwd_block_m, BLOCK_N=plan.bwd_block_n, **flags,
            num_warps=plan.bwd_warps, num_stages=plan.bwd_stages)
    elif direct:
        dk.zero_()
        dv.zero_()
    launch_dq(dq, q, k, v, dout, lse, delta, cu_q, cu_k, ints, common, flags, plan)
    if direct:
        return dq, dk, dv
    # fresh memory, never a view of the workspace (copy=True for fp32 inputs)
    return dq, (dk * scale).to(k.dtype), dv.to(v.dtype, copy=True)


@custom_op(f"{_OP}::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor | None,
            cu_k: torch.Tensor | None, ints: list[int], scale: float, softcap: float,
            plan_fields: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    plan = plan_from_op_fields(GQAPlan, plan_fields, Mode.NONDET)
    ints = resolve_op_ints(ints, q, k, cu_q, cu_k)
    return launch_fwd(q, k, v, cu_q, cu_k, ints, scale, softcap, plan.fwd_block_m,
                      plan.fwd_block_n, plan.fwd_warps, plan.fwd_stages)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@custom_op(f"{_OP}::bwd", mutates_args=("delta", "dkv_accum"))
def _bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, cu_q: torch.Tensor | None,
            cu_k: torch.Tensor | None, ints: list[int], scale: float, softcap: float,
            plan_fields: list[int], delta: torch.Tensor | None,
            dkv_accum: torch.Tensor | None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _deterministic_alert()
    plan = plan_from_op_fields(GQAPlan, plan_fields, Mode.NONDET)
    ints = resolve_op_ints(ints, q, k, cu_q, cu_k)
    return launch_bwd(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale, softcap, plan, delta,
                      dkv_accum)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale, softcap, plan_fields, delta,
              dkv_accum):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class _GQAFunction(torch.autograd.Function):
    """One attention call's autograd node (eager and under ``torch.compile``)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields, delta, dkv_accum):
        out, lse = op_or_body(f"{_OP}::fwd")(q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.ints, ctx.scale, ctx.softcap = ints, scale, softcap
        ctx.plan_fields, ctx.delta, ctx.dkv_accum = plan_fields, delta, dkv_accum
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        _deterministic_alert()  # before anything is launched, also in eager mode
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = op_or_body(f"{_OP}::bwd")(
            lastc(dout), q, k, v, out, lse, cu_q, cu_k, ctx.ints, ctx.scale, ctx.softcap,
            ctx.plan_fields, ctx.delta, ctx.dkv_accum)
        return dq, dk, dv, None, None, None, None, None, None, None, None


def gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
        *, max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
        softmax_scale: float | None = None, causal: bool = True,
        window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
        return_lse: bool = False, plan: GQAPlan | None = None,
        workspace: GQAWorkspace | None = None):
    """Grouped-query attention, differentiable, with a backward that is not bitwise
    repeatable (dK / dV summed over a KV head's query heads by fp32 atomic adds).

    The math, arguments, shapes, dtypes and errors are those of
    ``cake_gqa_det_train.gqa_det`` (plan: a :class:`GQAPlan`; workspace: a
    :class:`GQAWorkspace`). The forward's bits equal gqa_det's for equal forward tiles.
    The backward raises ``RuntimeError`` under ``torch.use_deterministic_algorithms(True)``
    before any launch (``warn_only=True``: one warning, then it runs); it never falls back
    to the deterministic kernels.

    Example::

        import torch
        from cake_gqa_train import gqa
        q = torch.randn(2, 128, 8, 64, requires_grad=True)  # CPU: Triton's interpreter
        k, v = torch.randn(2, 2, 128, 2, 64).unbind(0)
        gqa(q, k, v).sum().backward()
    """
    prob, plan, (delta, dkv_accum) = checked(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_size, softcap, return_lse, plan, workspace)
    q3, k3, v3 = packed(q, k, v)
    q3, k3, v3 = distinct(q3, k3, v3)
    if cu_seqlens_k is cu_seqlens_q:  # one tensor crosses once (None: "the same as q's")
        cu_seqlens_k = None
    out, lse = _GQAFunction.apply(q3, k3, v3, cu_seqlens_q, cu_seqlens_k, prob.op_ints(),
                                  prob.scale, prob.softcap, plan_to_op_fields(plan), delta,
                                  dkv_accum)
    out, lse = unpacked(out, lse, tuple(q.shape), prob)
    return (out, lse) if return_lse else out


def gqa_fwd(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, *, max_seqlen_q=None,
            max_seqlen_k=None, softmax_scale=None, causal=True, window_size=(-1, -1),
            softcap=0.0, plan: GQAPlan | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor, GQASavedSet]:
    """The forward alone: ``(out, lse, saved)`` (a :class:`GQASavedSet` for
    :func:`gqa_bwd`); arguments as :func:`gqa`."""
    prob, device = check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, softmax_scale, causal, window_size, softcap)
    plan = _resolve_plan(plan, prob.head_dim, q.dtype, device)
    return forward_saved(q, k, v, cu_seqlens_q, cu_seqlens_k, prob, plan, GQASavedSet,
                         Mode.NONDET)


def gqa_bwd(dout: torch.Tensor, saved: GQASavedSet, *,
            workspace: GQAWorkspace | None = None):
    """The backward alone: ``(dq, dk, dv)`` like the forward's q, k, v.

    Raises:
        ValueError: a saved set or workspace of another type or mode (e.g.
            cake_gqa_det_train's), a dout of another shape or dtype.
        RuntimeError: under ``torch.use_deterministic_algorithms(True)``, before any launch.
    """
    require_mode(saved, GQASavedSet, Mode.NONDET, name="saved")
    meta = saved.meta
    plan, prob = meta["plan"], meta["problem"]
    q_shape, k_shape, v_shape = meta["shapes"]
    d3 = checked_dout(dout, saved)
    delta, dkv_accum = _resolve_workspace(workspace, plan, saved.q.device, prob)
    _deterministic_alert()
    dq, dk, dv = launch_bwd(d3, saved.q, saved.k, saved.v, saved.out, saved.lse,
                            saved.cu_seqlens_q, saved.cu_seqlens_k, meta["ints"],
                            meta["scale"], meta["softcap"], plan, delta, dkv_accum)
    return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape)


def _refuse_deterministic(deterministic) -> None:
    if fa_flag(deterministic, "deterministic"):
        raise ValueError("deterministic: cake_gqa_train's backward is not deterministic; "
                         "use cake_gqa_det_train's flash_attn_func / flash_attn_varlen_func")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False):
    """flash-attn 2's ``flash_attn_func`` on cake's non-det kernels (``[B, S, H, D]``).
    ``deterministic=True``, ``dropout_p > 0``, ``alibi_slopes`` and
    ``return_attn_probs=True`` raise ``ValueError``."""
    refuse_fa_options(dropout_p, alibi_slopes, return_attn_probs, "gqa")
    _refuse_deterministic(deterministic)
    causal = fa_flag(causal, "causal")
    check_fa_batched(q)
    return gqa(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
               softcap=softcap)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn 2's ``flash_attn_varlen_func`` on cake's non-det kernels (packed
    ``[T, H, D]``); refusals as :func:`flash_attn_func`, and ``block_table``."""
    refuse_fa_options(dropout_p, alibi_slopes, return_attn_probs, "gqa")
    _refuse_deterministic(deterministic)
    causal = fa_flag(causal, "causal")
    check_fa_varlen(q, cu_seqlens_k, block_table)
    return gqa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
               max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
               window_size=window_size, softcap=softcap)
