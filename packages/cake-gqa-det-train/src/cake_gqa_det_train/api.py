"""Autograd entry (custom ops inside an autograd Function), the low-level forward and
backward, and flash-attn's two entry points, of deterministic grouped-query attention.

Math (:mod:`cake_gqa_det_train.reference`): per document and query head h (KV head
``h // (Hq / Hkv)``), P = softmax(scale * Q K^T + mask), O = P V, lse = logsumexp of the
masked scaled scores (natural log, fp32); FlashAttention-2's algorithm (Dao, 2023): the
forward walks key blocks with an online softmax; the backward recomputes P from lse. The
mask aligns causal attention to the bottom right when a document has fewer queries than
keys (flash-attn 2's convention); ``window_size`` and ``softcap`` as flash-attn. A query
row with no visible key gets O = 0 and lse = -inf (flash-attn writes +inf there).

Determinism: dK and dV of a KV head are summed by one program over its query heads (head
order) and query blocks (block order); dQ by another program over key blocks (block
order); no atomics, so equal inputs and plan give equal bits.
"""

from __future__ import annotations

import torch
from cake_core import Mode, require_mode
from cake_core.autograd import once_differentiable
from cake_core.compile import custom_op, op_or_body, plan_from_op_fields, plan_to_op_fields

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
from cake_gqa_det_train.launch import launch_bwd_det, launch_fwd
from cake_gqa_det_train.plan import GQADetPlan, make_plan
from cake_gqa_det_train.saved import GQADetSavedSet, GQADetWorkspace

_OP = "cake_gqa_det_train"


def _resolve_plan(plan, D: int, dtype, device) -> GQADetPlan:
    return resolve_plan(plan, GQADetPlan, Mode.DET, D, dtype, device, make_plan)


def _resolve_workspace(workspace, plan: GQADetPlan, device, prob: Problem):
    if workspace is None:
        return None
    require_mode(workspace, GQADetWorkspace, Mode.DET, name="workspace")
    workspace.check(plan, device)
    if "delta" not in workspace.names:
        raise ValueError("workspace: no 'delta' buffer; build it with "
                         "GQADetWorkspace.for_plan(plan, device, num_heads, max_tokens)")
    buf = workspace["delta"]
    need = prob.heads_q * prob.n_tok_q
    if buf.dtype != torch.float32 or buf.dim() != 1 or not buf.is_contiguous() \
            or buf.numel() < need:
        raise ValueError(f"workspace: 'delta' must be a contiguous 1-D fp32 tensor of at least "
                         f"{need} values (heads x query tokens), got {str(buf.dtype)[6:]} "
                         f"{list(buf.shape)}; build it with GQADetWorkspace.for_plan(plan, "
                         f"device, num_heads={prob.heads_q}, max_tokens={prob.n_tok_q})")
    return buf


def checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size, softcap, return_lse, plan, workspace, *,
            meta_ok: bool = False) -> tuple[Problem, GQADetPlan, torch.Tensor | None]:
    """Every check of :func:`gqa_det` (``ValueError``), nothing launched or allocated; run
    by gqa_det, ``is_supported`` and ``saved_bytes``. Returns ``(problem, plan, the
    workspace's delta buffer or None)``. ``meta_ok``: as ``inputs.check_call``."""
    prob, device = check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, softmax_scale, causal, window_size, softcap,
                              meta_ok=meta_ok)
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse: expected a bool, got {return_lse!r}")
    plan = _resolve_plan(plan, prob.head_dim, q.dtype, device)
    return prob, plan, _resolve_workspace(workspace, plan, device, prob)


# ----------------------------------------------------------------------------- custom ops


@custom_op(f"{_OP}::fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor | None,
            cu_k: torch.Tensor | None, ints: list[int], scale: float, softcap: float,
            plan_fields: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    plan = plan_from_op_fields(GQADetPlan, plan_fields)
    ints = resolve_op_ints(ints, q, k, cu_q, cu_k)
    return launch_fwd(q, k, v, cu_q, cu_k, ints, scale, softcap, plan.fwd_block_m,
                      plan.fwd_block_n, plan.fwd_warps, plan.fwd_stages)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields):
    Tq, Hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((Hq, Tq), dtype=torch.float32)


@custom_op(f"{_OP}::bwd", mutates_args=("delta",))
def _bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: torch.Tensor, lse: torch.Tensor, cu_q: torch.Tensor | None,
            cu_k: torch.Tensor | None, ints: list[int], scale: float, softcap: float,
            plan_fields: list[int], delta: torch.Tensor | None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = plan_from_op_fields(GQADetPlan, plan_fields)
    ints = resolve_op_ints(ints, q, k, cu_q, cu_k)
    return launch_bwd_det(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale, softcap, plan,
                          delta)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_q, cu_k, ints, scale, softcap, plan_fields, delta):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class _GQAFunction(torch.autograd.Function):
    """One attention call's autograd node (eager, and traced by dynamo under
    ``torch.compile``: the same ops, the same bits). Saved tensors go through
    ``save_for_backward`` (``torch.utils.checkpoint`` and saved-tensor hooks work); the
    workspace buffer stays on ctx."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields, delta):
        out, lse = op_or_body(f"{_OP}::fwd")(q, k, v, cu_q, cu_k, ints, scale, softcap, plan_fields)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.ints, ctx.scale, ctx.softcap = ints, scale, softcap
        ctx.plan_fields, ctx.delta = plan_fields, delta
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = op_or_body(f"{_OP}::bwd")(
            lastc(dout), q, k, v, out, lse, cu_q, cu_k, ctx.ints, ctx.scale, ctx.softcap,
            ctx.plan_fields, ctx.delta)
        return dq, dk, dv, None, None, None, None, None, None, None


# ----------------------------------------------------------------------------- public API


def gqa_det(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            cu_seqlens_q: torch.Tensor | None = None,
            cu_seqlens_k: torch.Tensor | None = None, *,
            max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
            softmax_scale: float | None = None, causal: bool = True,
            window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
            return_lse: bool = False, plan: GQADetPlan | None = None,
            workspace: GQADetWorkspace | None = None):
    """Deterministic causal / windowed grouped-query attention, differentiable.

    Per document and query head h (KV head ``h // (Hq / Hkv)``):
    ``O = softmax(scale * Q K^T + mask) V``, with query i of Lq seeing key j of Lk when
    ``j <= i + Lk - Lq + right`` and ``j >= i + Lk - Lq - left`` (``right = 0`` under
    ``causal``: the bottom-right alignment of flash-attn 2; -1 = unbounded); ``softcap > 0``
    replaces the scores s by ``softcap * tanh(s / softcap)`` first. A row with no visible
    key gives O = 0 and lse = -inf.

    Args:
        q: ``[B, Sq, Hq, D]``, or packed ``[Tq, Hq, D]`` with ``cu_seqlens_q``.
        k, v: ``[B, Sk, Hkv, D]`` / ``[Tk, Hkv, D]``; Hq a multiple of Hkv; D in
            (64, 128, 256), the same for q, k and v. bf16, fp16 or fp32 (fp32's dots run
            in TF32 on CUDA); last dim contiguous.
        cu_seqlens_q, cu_seqlens_k: packed input's offsets, ``[N + 1]`` int32/int64 from 0
            to Tq / Tk, non-decreasing (empty and length-1 documents allowed);
            ``cu_seqlens_k`` defaults to ``cu_seqlens_q``. Their values are read once per
            tensor version (a host sync) and checked.
        max_seqlen_q, max_seqlen_k: the longest document (default: read from the offsets);
            a value below the true one is refused.
        softmax_scale: default ``D ** -0.5``. causal: bottom-right causal mask.
        window_size: ``(left, right)`` as flash-attn (-1: unbounded; a side at least as
            long as the sequence is unbounded too). softcap: 0 (off) or > 0.
        return_lse: also return lse, fp32 ``[Hq, Tq]`` (packed) or ``[B, Hq, Sq]``; it
            carries no gradient.
        plan: a :class:`GQADetPlan` for D (default :func:`make_plan`).
        workspace: a :class:`GQADetWorkspace` for the plan (default: allocated per
            backward).

    Returns:
        ``out`` like q (q's dtype), or ``(out, lse)``.

    Raises:
        ValueError: bad shapes, dtypes, devices, strides, offsets, options, plan,
            workspace or mode, before any launch; the caller's tensors are not modified.

    Example::

        import torch
        from cake_gqa_det_train import gqa_det
        q = torch.randn(2, 128, 8, 64)          # CPU: Triton's interpreter, fp32
        k, v = torch.randn(2, 2, 128, 2, 64).unbind(0)
        out = gqa_det(q, k, v)                   # [2, 128, 8, 64]
    """
    prob, plan, delta = checked(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, softmax_scale, causal, window_size, softcap,
                                return_lse, plan, workspace)
    q3, k3, v3 = packed(q, k, v)
    q3, k3, v3 = distinct(q3, k3, v3)
    if cu_seqlens_k is cu_seqlens_q:  # one tensor crosses once (None: "the same as q's")
        cu_seqlens_k = None
    out, lse = _GQAFunction.apply(q3, k3, v3, cu_seqlens_q, cu_seqlens_k, prob.op_ints(),
                                  prob.scale, prob.softcap, plan_to_op_fields(plan), delta)
    out, lse = unpacked(out, lse, tuple(q.shape), prob)
    return (out, lse) if return_lse else out


def gqa_det_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor | None = None,
                cu_seqlens_k: torch.Tensor | None = None, *,
                max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                softmax_scale: float | None = None, causal: bool = True,
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                plan: GQADetPlan | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, GQADetSavedSet]:
    """The forward alone, outside autograd: ``(out, lse, saved)``, arguments and shapes as
    :func:`gqa_det`; ``saved`` (a :class:`GQADetSavedSet`) is what :func:`gqa_det_bwd`
    takes. Raises ``ValueError`` as :func:`gqa_det`."""
    prob, device = check_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, softmax_scale, causal, window_size, softcap)
    plan = _resolve_plan(plan, prob.head_dim, q.dtype, device)
    return forward_saved(q, k, v, cu_seqlens_q, cu_seqlens_k, prob, plan, GQADetSavedSet,
                         Mode.DET)


def gqa_det_bwd(dout: torch.Tensor, saved: GQADetSavedSet, *,
                workspace: GQADetWorkspace | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward alone: ``(dq, dk, dv)`` shaped like the forward's q, k, v, in their
    dtypes, bitwise repeatable for the same saved set and plan.

    Args:
        dout: the gradient of ``out``, its shape, q's dtype.
        saved: the :class:`GQADetSavedSet` of :func:`gqa_det_fwd`.
        workspace: a :class:`GQADetWorkspace` for the saved set's plan, or ``None``.

    Raises:
        ValueError: a saved set or workspace of another type or mode (e.g. the
            non-deterministic ``cake_gqa_train``'s), a dout of another shape or dtype.
    """
    require_mode(saved, GQADetSavedSet, Mode.DET, name="saved")
    meta = saved.meta
    plan, prob = meta["plan"], meta["problem"]
    q_shape, k_shape, v_shape = meta["shapes"]
    d3 = checked_dout(dout, saved)
    delta = _resolve_workspace(workspace, plan, saved.q.device, prob)
    dq, dk, dv = launch_bwd_det(d3, saved.q, saved.k, saved.v, saved.out, saved.lse,
                                saved.cu_seqlens_q, saved.cu_seqlens_k, meta["ints"],
                                meta["scale"], meta["softcap"], plan, delta)
    return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape)


# ----------------------------------------------------------------------------- flash-attn


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False):
    """flash-attn 2's ``flash_attn_func`` on cake's det kernels: q ``[B, Sq, Hq, D]``,
    k, v ``[B, Sk, Hkv, D]`` -> out like q. ``deterministic`` is accepted and changes
    nothing (the backward always is). ``dropout_p > 0``, ``alibi_slopes`` and
    ``return_attn_probs=True`` raise ``ValueError``; other errors as :func:`gqa_det`."""
    refuse_fa_options(dropout_p, alibi_slopes, return_attn_probs, "gqa_det")
    fa_flag(deterministic, "deterministic")  # accepted; the backward always is
    causal = fa_flag(causal, "causal")
    check_fa_batched(q)
    return gqa_det(q, k, v, softmax_scale=softmax_scale, causal=causal,
                   window_size=window_size, softcap=softcap)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn 2's ``flash_attn_varlen_func`` on cake's det kernels: packed q
    ``[Tq, Hq, D]``, k, v ``[Tk, Hkv, D]`` with their offsets -> out ``[Tq, Hq, D]``.
    ``deterministic`` is accepted and changes nothing. ``dropout_p > 0``,
    ``alibi_slopes``, ``return_attn_probs=True`` and ``block_table`` raise
    ``ValueError``; other errors as :func:`gqa_det`."""
    refuse_fa_options(dropout_p, alibi_slopes, return_attn_probs, "gqa_det")
    fa_flag(deterministic, "deterministic")  # accepted; the backward always is
    causal = fa_flag(causal, "causal")
    check_fa_varlen(q, cu_seqlens_k, block_table)
    return gqa_det(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                   max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                   window_size=window_size, softcap=softcap)
