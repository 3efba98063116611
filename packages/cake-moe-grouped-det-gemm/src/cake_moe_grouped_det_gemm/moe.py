"""A deterministic mixture-of-experts feed-forward layer on the det grouped GEMM.

Math (T tokens ``x [T, d]``, E experts, top-k, SwiGLU experts of width f)::

    logits = x · Rᵀ                         [T, E], fp32 (R: router_weight [E, d])
    p      = softmax(logits)                [T, E], fp32
    ids[t] = the k experts of highest p[t], ties to the lower expert index
    w[t]   = p[t, ids[t]]  (/ their sum when normalize_topk)            [T, k], fp32
    h      = x[t] · W_gu[e]ᵀ,  a = silu(h[:f]) * h[f:],  o = a · W_d[e]ᵀ   per (t, e=ids[t, j])
    y[t]   = Σ_j w[t, j] · o[t, j]          (j = 0, 1, ..., k-1 in that order, fp32)
    aux    = aux_loss_coef · E · Σ_e f_e · P_e,   f_e = (assignments to e) / (T k),
             P_e = mean_t p[t, e]

Sources: the top-k softmax router with renormalised top-k weights and SwiGLU experts as in
Mixtral (Jiang et al. 2024, arXiv:2401.04088) and Qwen3-MoE (``norm_topk_prob``); SwiGLU
(Shazeer 2020, arXiv:2002.05202); the load-balancing loss of Switch Transformer (Fedus et
al. 2021, arXiv:2101.03961, eq. 4), normalised over the T·k assignments as Megatron-Core's
``switch_load_balancing_loss_func`` (a uniform router gives ``aux = aux_loss_coef``).

Every reduction has a fixed order and no step uses floating atomics (``index_add_``,
``scatter_add_``): the router and expert GEMMs are :func:`moe_grouped_det_gemm` (the router
as one group), the token permutation is a stable sort of the expert ids (a gather both
ways), the combine gathers each token's k rows and sums them in slot order, and the
gradient of the permutation sums each token's k row gradients in slot order. No step reads
a device value on the host (no sync).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch
from cake_core import check_dtype, check_same_device, check_shape, check_tensor
from cake_core.autograd import once_differentiable
from cake_core.checks import FLOAT_DTYPES, check_flag, check_ndim
from cake_core.compile import custom_op, op_or_body, optional_output
from cake_core.gemm import direct_store_dtype
from cake_core.swiglu import swiglu
from cake_core.triton_utils import cdiv, launch_device_check, next_power_of_2
from torch import nn

from cake_moe_grouped_det_gemm.api import _resolve_plan, routed_gemm
from cake_moe_grouped_det_gemm.kernels import (
    combine_bwd_kernel,
    gather_sum_kernel,
    route_bwd_kernel,
    route_fwd_kernel,
)
from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan, make_plan

__all__ = [
    "MoEFeedForward",
    "MoEFeedForwardPlans",
    "MoERouting",
    "make_moe_plans",
    "moe_experts_det",
    "moe_feed_forward_det",
    "moe_permute_det",
    "moe_route_det",
    "moe_topk_det",
    "moe_unpermute_det",
]

_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- routing


class _TakeTopK(torch.autograd.Function):
    """``probs.gather(1, ids)`` whose backward writes each gradient to its one place
    (``ids`` are distinct in each row, so no element is written twice: no add, no order)."""

    @staticmethod
    def forward(ctx, probs, ids):
        ctx.save_for_backward(ids)
        ctx.shape = probs.shape
        return probs.gather(1, ids)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        g = grad.new_zeros(ctx.shape)
        return g.scatter_(1, ids, grad), None


def moe_topk_det(probs: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` largest entries of each row of ``probs`` with a fixed tie-break.

    Args:
        probs: ``[T, E]`` floating router scores (any dtype, any strides).
        top_k: k, ``1 <= k <= E``.

    Returns:
        ``(weights, ids)``: ``weights`` ``[T, k]`` (``probs``' dtype, differentiable in
        ``probs``: the backward writes each gradient to its own place, no atomic adds) and
        ``ids`` int64 ``[T, k]``, the experts by decreasing score; among equal scores the
        lower expert index comes first (a stable descending sort,
        ``torch.sort(..., stable=True)``), so ties are broken the same way on every run and
        device. ``torch.topk`` promises no order among ties, so it is not used.

    Raises:
        ValueError: ``probs`` not a 2-D floating tensor, k out of ``[1, E]``.
    """
    check_tensor(probs, "probs")
    check_ndim(probs, "probs", ndim=2, layout="[T, E]: tokens by experts")
    if not probs.is_floating_point():
        raise ValueError(f"probs: expected a floating dtype, got {str(probs.dtype)[6:]}")
    _check_top_k(top_k, probs.shape[1])
    ids = torch.sort(probs.detach(), dim=1, descending=True, stable=True).indices
    ids = ids[:, :top_k].contiguous()
    return _TakeTopK.apply(probs, ids), ids


def _route_launch(device: torch.device, E: int, k: int) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_E, BLOCK_K)`` of the routing kernels, by rule: whole rows of the
    E experts per program, 2048 elements a tile on CUDA (16 per thread of 4 warps, several
    tiles live at once); 16384 under the interpreter (fewer interpreted programs)."""
    be = next_power_of_2(E)
    return max(1, (2048 if device.type == "cuda" else 16384) // be), be, next_power_of_2(k)


@custom_op("cake_moe_grouped_det_gemm::route_fwd", mutates_args=())
def _route_fwd_op(logits: torch.Tensor, k: int, normalize: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    dev, f32 = logits.device, torch.float32
    probs = torch.empty((T, E), dtype=f32, device=dev)
    ids = torch.empty((T, k), dtype=torch.int64, device=dev)
    w = torch.empty((T, k), dtype=f32, device=dev)
    s = torch.empty((T,) if normalize else (0,), dtype=f32, device=dev)
    if T:
        bt, be, bk = _route_launch(dev, E, k)
        route_fwd_kernel[(cdiv(T, bt),)](
            logits, probs, ids, w, s if normalize else w, T, E, logits.stride(0), K=k,
            NORMALIZE=normalize, BLOCK_T=bt, BLOCK_E=be, BLOCK_K=bk, num_warps=4)
    return probs, ids, w, s


@_route_fwd_op.register_fake
def _route_fwd_fake(logits, k, normalize):
    T, E = logits.shape
    f32 = torch.float32
    return (logits.new_empty((T, E), dtype=f32), logits.new_empty((T, k), dtype=torch.int64),
            logits.new_empty((T, k), dtype=f32),
            logits.new_empty((T,) if normalize else (0,), dtype=f32))


@custom_op("cake_moe_grouped_det_gemm::route_bwd", mutates_args=())
def _route_bwd_op(probs: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, s: torch.Tensor,
                  dw: torch.Tensor, dprobs: torch.Tensor | None, normalize: bool,
                  dtype: torch.dtype) -> torch.Tensor:
    T, E = probs.shape
    k = ids.shape[1]
    dl = torch.empty((T, E), dtype=direct_store_dtype(dtype), device=probs.device)
    if T:
        bt, be, bk = _route_launch(probs.device, E, k)
        route_bwd_kernel[(cdiv(T, bt),)](
            probs, ids, w, s if normalize else w, dw,
            dprobs if dprobs is not None else probs, dl, T, E, dl.stride(0), K=k,
            NORMALIZE=normalize, HAS_DP=dprobs is not None, BLOCK_T=bt, BLOCK_E=be,
            BLOCK_K=bk, num_warps=4)
    return dl.to(dtype)  # a no-op but for bf16 under the interpreter (its casts truncate)


@_route_bwd_op.register_fake
def _route_bwd_fake(probs, ids, w, s, dw, dprobs, normalize, dtype):
    return probs.new_empty(probs.shape, dtype=dtype)


class _Route(torch.autograd.Function):
    """The top-k softmax gate: ``(probs, weights, ids)`` from the logits, one launch each
    way (:mod:`cake_moe_grouped_det_gemm.kernels.route`)."""

    @staticmethod
    def forward(ctx, logits, k, normalize):
        probs, ids, w, s = op_or_body("cake_moe_grouped_det_gemm::route_fwd")(
            logits, k, normalize)
        ctx.mark_non_differentiable(ids)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(probs, ids, w, s)
        ctx.normalize, ctx.dtype = normalize, logits.dtype
        return probs, w, ids

    @staticmethod
    @once_differentiable
    def backward(ctx, dprobs, dw, _dids):
        if dprobs is None and dw is None:
            return None, None, None
        probs, ids, w, s = ctx.saved_tensors
        dw = torch.zeros_like(w) if dw is None else dw.contiguous()
        dl = op_or_body("cake_moe_grouped_det_gemm::route_bwd")(
            probs, ids, w, s, dw, None if dprobs is None else dprobs.contiguous(),
            ctx.normalize, ctx.dtype)
        return dl, None, None


class MoERouting(NamedTuple):
    """Where each token's k assignments go, from :func:`moe_route_det` (all on the device).

    Assignment ``a = t·k + j`` is token t's j-th expert. After the stable sort by expert,
    sorted row ``p`` holds assignment ``order[p]``; expert e owns sorted rows
    ``[offs[e-1], offs[e])`` in increasing token order.

    Fields:
        ids: int64 ``[T, k]`` expert of each assignment (:func:`moe_topk_det`'s order).
        weights: fp32 ``[T, k]`` combine weight of each assignment (differentiable).
        probs: fp32 ``[T, E]`` router softmax (differentiable).
        order: int64 ``[T·k]``, sorted row -> assignment.
        slot: int64 ``[T·k]``, assignment -> sorted row (the inverse of ``order``).
        offs: int32 ``[E]``, cumulative end of each expert's sorted rows (the grouped GEMM's
            ``offs``).
    """

    ids: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor
    order: torch.Tensor
    slot: torch.Tensor
    offs: torch.Tensor


def moe_route_det(logits: torch.Tensor, top_k: int, *,
                  normalize_topk: bool = True) -> MoERouting:
    """Top-k softmax routing and the stable sort of the assignments by expert.

    Args:
        logits: ``[T, E]`` router logits (any floating dtype; computed on in fp32).
        top_k: k, ``1 <= k <= E``.
        normalize_topk: divide each token's k weights by their sum (Mixtral; Qwen3-MoE's
            ``norm_topk_prob=True``); else the weights are the softmax probabilities.

    Returns:
        :class:`MoERouting`. ``probs = softmax(logits)`` in fp32, ``ids`` its k largest
        entries (ties to the lower expert index, as :func:`moe_topk_det`) and ``weights``
        (divided by their sum, added in j order, with ``normalize_topk``): one kernel
        launch each way, per token row; ``order`` a stable
        sort of the flattened ids (``torch.sort(stable=True)`` of int64 keys: one answer);
        ``slot`` its inverse (each element written once); ``offs`` by
        ``torch.searchsorted`` of the sorted ids (no counting with atomics, no host sync).

    Raises:
        ValueError: bad ``logits`` (also on a device the backend cannot launch on, or
            meta) or ``top_k``, ``T·k`` over 2³¹ - 1.
    """
    check_tensor(logits, "logits")
    check_ndim(logits, "logits", ndim=2, layout="[T, E]: tokens by experts")
    check_dtype(logits, "logits", FLOAT_DTYPES)
    T, E = logits.shape
    _check_top_k(top_k, E)
    check_flag(normalize_topk, "normalize_topk")
    launch_device_check(logits.device, "logits")  # before any allocation or launch
    if T * top_k > _INT32_MAX:
        raise ValueError(f"logits: T·k = {T * top_k} assignments exceed int32 offsets")
    if logits.stride(-1) != 1 and E > 1:
        logits = logits.contiguous()  # the kernel reads each row with a unit stride
    probs, weights, ids = _Route.apply(logits, int(top_k), bool(normalize_topk))
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
    slot = torch.empty_like(order).scatter_(
        0, order, torch.arange(order.numel(), device=order.device))
    offs = torch.searchsorted(sorted_ids, torch.arange(E, device=ids.device), right=True)
    return MoERouting(ids, weights, probs, order, slot, offs.to(torch.int32))


# ----------------------------------------------------------------------------- permutation


def _gather_launch(device: torch.device, n_col: int) -> tuple[int, int]:
    """``(BLOCK_T, BLOCK_D)`` of the gather kernels, by rule: on CUDA 4 token rows by up to
    512 columns (4 warps stream 2048 elements a step); under the interpreter 16 rows by up to
    256 (fewer, fuller interpreted programs)."""
    if device.type == "cuda":
        return 4, min(512, next_power_of_2(n_col))
    return 16, min(256, next_power_of_2(n_col))


@custom_op("cake_moe_grouped_det_gemm::gather_sum", mutates_args=())
def _gather_sum_op(src: torch.Tensor, slot: torch.Tensor, k: int,
                   weights: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    T, d = slot.numel() // k, src.shape[1]
    y = torch.empty((T, d), dtype=dtype, device=src.device)
    if T and d:
        bt, bd = _gather_launch(src.device, d)
        gather_sum_kernel[(cdiv(T, bt), cdiv(d, bd))](
            src, weights if weights is not None else src, slot, y, T, d, src.stride(0),
            y.stride(0), K=k, HAS_W=weights is not None, BLOCK_T=bt, BLOCK_D=bd, num_warps=4,
            enable_fp_fusion=False)  # w·x rounded to fp32 before the add (no FMA): the order
    return y


@_gather_sum_op.register_fake
def _gather_sum_fake(src, slot, k, weights, dtype):
    return src.new_empty((slot.numel() // k, src.shape[1]), dtype=dtype)


def _gather_sum(src: torch.Tensor, slot: torch.Tensor, k: int,
                weights: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``y[t] = Σ_j weights[t, j] · src[slot[t·k + j]]`` (weight 1 without ``weights``), j in
    slot order, fp32, one launch; y ``[T, d]`` in ``dtype``. A custom op under
    ``torch.compile`` (dynamo cannot trace every Triton launch), its body eagerly."""
    return op_or_body("cake_moe_grouped_det_gemm::gather_sum")(src, slot, k, weights, dtype)


@custom_op("cake_moe_grouped_det_gemm::combine_bwd", mutates_args=())
def _combine_bwd_op(dy: torch.Tensor, out: torch.Tensor, weights: torch.Tensor,
                    slot: torch.Tensor, need_dout: bool, need_dw: bool,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    T, k = weights.shape
    # each expert row p = slot[t·k + j] written once, by token t's program
    dout = torch.empty_like(out) if need_dout else None
    dweights = torch.empty((T, k), dtype=torch.float32, device=dy.device) if need_dw \
        else None
    if T and (need_dout or need_dw):
        bt, bd = _gather_launch(dy.device, out.shape[1])
        combine_bwd_kernel[(cdiv(T, bt),)](
            dy, out, weights, slot, dout if need_dout else dy,
            dweights if need_dw else weights, T, out.shape[1], dy.stride(0),
            out.stride(0), dout.stride(0) if need_dout else 0, K=k,
            NEED_DOUT=need_dout, NEED_DW=need_dw, BLOCK_T=bt, BLOCK_D=bd, num_warps=4)
    return optional_output(dout, dy), optional_output(dweights, dy)


@_combine_bwd_op.register_fake
def _combine_bwd_fake(dy, out, weights, slot, need_dout, need_dw):
    return (torch.empty_like(out) if need_dout else dy.new_empty((0,), dtype=torch.float32),
            dy.new_empty(weights.shape if need_dw else (0,), dtype=torch.float32))


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, order, slot, top_k):
        ctx.save_for_backward(slot.contiguous())  # the kernel reads slot[t·k + j] at SLOT + t·k + j
        ctx.top_k = top_k
        return x.index_select(0, torch.div(order, top_k, rounding_mode="floor"))

    @staticmethod
    @once_differentiable
    def backward(ctx, dxp):
        (slot,) = ctx.saved_tensors
        # slot order: ((g0 + g1) + g2) + ..., fp32, one launch
        return _gather_sum(_rows(dxp), slot, ctx.top_k, None, dxp.dtype), None, None, None


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``[R, d]`` with unit column stride (the gather kernels' layout), copied if not."""
    return t if t.stride(1) == 1 else t.contiguous()


def moe_permute_det(x: torch.Tensor, routing: MoERouting) -> torch.Tensor:
    """Tokens to expert-sorted rows: ``xp[p] = x[order[p] // k]`` ``[T·k, d]``.

    Backward (deterministic, no ``index_add_``): ``dx[t] = Σ_j dxp[slot[t·k + j]]``, the k
    row gradients of token t gathered and summed in fp32 in slot order j = 0, 1, ...,
    cast once to x's dtype (one kernel launch).

    Args:
        x: ``[T, d]``, any floating dtype. routing: from :func:`moe_route_det`.

    Raises:
        ValueError: ``routing`` not a :class:`MoERouting`, x not a 2-D floating tensor of
            the routing's T rows on its device; before any launch.
    """
    _, k = _check_routed_rows(x, "x", routing, per_token=False)
    return _Permute.apply(x, routing.order, routing.slot, k)


def _check_routed_rows(t, name: str, routing, *, per_token: bool) -> tuple[int, int]:
    """Checks of :func:`moe_permute_det`'s x (T rows) or :func:`moe_unpermute_det`'s out
    (``per_token``: T·k rows) against ``routing`` -> ``(T, k)``; the gather kernels read
    rows by the routing's slots, so a tensor of other rows would be read out of bounds."""
    if not all(isinstance(getattr(routing, f, None), torch.Tensor) for f in MoERouting._fields):
        raise ValueError(f"routing: expected a MoERouting (from moe_route_det), got "
                         f"{type(routing).__name__}")
    T, k = routing.weights.shape
    check_tensor(t, name)
    check_ndim(t, name, ndim=2, layout="[T·k, d]: expert rows in sorted order" if per_token
               else "[T, d]: one row per token")
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating dtype, got {str(t.dtype)[6:]}")
    check_shape(t, name, [T * k if per_token else T, None],
                layout=f"the routing's {'T·k' if per_token else 'T'} rows")
    check_same_device((name, t), ("routing", routing.slot))
    return T, k


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, weights, order, slot):
        out, weights, slot = _rows(out), weights.contiguous(), slot.contiguous()
        ctx.save_for_backward(out, weights, slot)
        # slot order: ((w0 o0 + w1 o1) + w2 o2) + ..., fp32, one launch
        return _gather_sum(out, slot, weights.shape[1], weights, out.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        out, weights, slot = ctx.saved_tensors
        T, k = weights.shape
        need_dout, need_dw = ctx.needs_input_grad[:2]
        dout, dweights = op_or_body("cake_moe_grouped_det_gemm::combine_bwd")(
            _rows(dy), out, weights, slot, need_dout, need_dw)
        dout, dweights = (dout if need_dout else None), (dweights if need_dw else None)
        return dout, dweights, None, None


def moe_unpermute_det(out: torch.Tensor, routing: MoERouting) -> torch.Tensor:
    """The combine: ``y[t] = Σ_j weights[t, j] · out[slot[t·k + j]]`` ``[T, d]``.

    Each token's k expert rows are gathered and summed in fp32 in slot order j = 0, 1, ...
    (``((w0 o0 + w1 o1) + w2 o2) + ...``), cast once to out's dtype; never ``index_add_`` /
    ``scatter_add_``. Backward: ``dout[slot[t·k + j]] = weights[t, j] · dy[t]`` (each expert
    row written once, cast to out's dtype) and ``dweights[t, j] = <dy[t], out[slot[t·k +
    j]]>`` in fp32 (the columns summed in increasing blocks). One kernel launch each way.

    Args:
        out: ``[T·k, d]`` expert outputs in sorted order. routing: from
            :func:`moe_route_det` (its fp32 ``weights`` are differentiable).

    Raises:
        ValueError: ``routing`` not a :class:`MoERouting`, out not a 2-D floating tensor of
            the routing's T·k rows on its device; before any launch.
    """
    _check_routed_rows(out, "out", routing, per_token=True)
    return _Unpermute.apply(out, routing.weights, routing.order, routing.slot)


# ----------------------------------------------------------------------------- plans


class MoEFeedForwardPlans(NamedTuple):
    """The three grouped-GEMM plans of one :func:`moe_feed_forward_det` call: ``router``
    (E=1 group, N = num_experts, K = d_model, fp32), ``gate_up`` (N = 2·d_ff, K = d_model)
    and ``down`` (N = d_model, K = d_ff)."""

    router: MoEGroupedDetPlan
    gate_up: MoEGroupedDetPlan
    down: MoEGroupedDetPlan


def make_moe_plans(num_tokens: int, d_model: int, d_ff: int, num_experts: int, top_k: int,
                   dtype: torch.dtype, device: torch.device | str) -> MoEFeedForwardPlans:
    """The plans :func:`moe_feed_forward_det` picks for ``num_tokens`` tokens (by
    :func:`make_plan`'s rule: the router over T rows in fp32, the experts over T·k rows in
    ``dtype``). Raises ``ValueError`` as :func:`make_plan`, and for top_k outside
    ``[1, num_experts]``."""
    return _make_moe_plans(num_tokens, d_model, d_ff, num_experts, top_k, dtype, device)


def _make_moe_plans(num_tokens, d_model, d_ff, num_experts, top_k, dtype, device, *,
                    rule=None, plans_cls=MoEFeedForwardPlans):
    """:func:`make_moe_plans` with the plan rule and the plans type as arguments (the nondet
    sibling passes its own)."""
    rule = rule or make_plan
    k = _check_top_k(top_k, num_experts if isinstance(num_experts, int) else 0)
    rows = num_tokens * k if isinstance(num_tokens, numbers.Integral) else num_tokens
    return plans_cls(
        router=rule(num_tokens, 1, num_experts, d_model, torch.float32, device),
        gate_up=rule(rows, num_experts, 2 * d_ff, d_model, dtype, device),
        down=rule(rows, num_experts, d_model, d_ff, dtype, device),
    )


# ----------------------------------------------------------------------------- the layer


def _check_top_k(top_k, E: int) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or \
            not 1 <= top_k <= E:
        raise ValueError(f"top_k: must be an int in [1, num_experts={E}], got {top_k!r}")
    return int(top_k)


def _check_coef(v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
        raise ValueError(f"aux_loss_coef: expected a finite number >= 0, got {v!r}")
    return float(v)


_W_DOWN = "[E, d_model, d_ff]: E stacked torch.nn.Linear(d_ff, d_model) weights"


def _check_experts_weights(x, w_gate_up, w_down, E: int, d: int):
    """x, w_gate_up, w_down against ``E`` experts of width d_model ``d`` -> d_ff."""
    check_tensor(w_down, "w_down")
    check_ndim(w_down, "w_down", ndim=3, layout=_W_DOWN)
    f = w_down.shape[2]
    if f < 1:
        raise ValueError(f"w_down: needs d_ff >= 1, got {list(w_down.shape)}")
    check_shape(w_down, "w_down", [E, d, f], layout=_W_DOWN)
    check_dtype(w_down, "w_down", (x.dtype,))
    check_tensor(w_gate_up, "w_gate_up")
    check_shape(w_gate_up, "w_gate_up", [E, 2 * f, d],
                layout="[E, 2 * d_ff, d_model]: E stacked torch.nn.Linear weights, gate rows "
                       "then up rows")
    check_dtype(w_gate_up, "w_gate_up", (x.dtype,))
    return f


def _check_plans(plans, plans_cls, resolve, T, k, E, d, f, dtype, device):
    """The layer's plans resolved for this call (``None`` fields: the rule's, per GEMM)."""
    if plans is None:
        return plans_cls(None, None, None)
    if not isinstance(plans, plans_cls):
        raise ValueError(f"plans: expected {plans_cls.__name__}, got {type(plans).__name__}")
    resolve = resolve or _resolve_plan
    return plans_cls(
        resolve(plans.router, T, 1, E, d, torch.float32, device),
        resolve(plans.gate_up, T * k, E, 2 * f, d, dtype, device),
        resolve(plans.down, T * k, E, d, f, dtype, device))


def _check_x(x) -> None:
    check_tensor(x, "x")
    check_dtype(x, "x", FLOAT_DTYPES)
    check_ndim(x, "x", min_ndim=1, layout="[..., d_model]")


def _check_routing(x, router, w_gate_up, w_down, E, d, f, top_k, normalize_topk, plans,
                   plans_cls, resolve, launch):
    """The checks the layer and :func:`moe_experts_det` share after their own: top_k,
    normalize_topk, the int32 assignment count, devices (``router``: (name, tensor) of the
    router's weight or logits), plans -> ``(T, top_k, device, plans)``."""
    top_k = _check_top_k(top_k, E)
    check_flag(normalize_topk, "normalize_topk")
    T = x.numel() // d
    if T * top_k > _INT32_MAX:
        raise ValueError(f"x: T·k = {T * top_k} assignments exceed int32 offsets")
    device = check_same_device(("x", x), router, ("w_gate_up", w_gate_up), ("w_down", w_down))
    plans = _check_plans(plans, plans_cls, resolve, T, top_k, E, d, f, x.dtype, device)
    if launch:
        launch_device_check(device, "x")
    return T, top_k, device, plans


def _check_layer(x, router_weight, w_gate_up, w_down, top_k, normalize_topk, aux_loss_coef,
                 plans, plans_cls=MoEFeedForwardPlans, resolve=None, *, launch=True):
    """Every check of the layer's forward (no allocation, launch or sync; the queries run
    it too); ``launch=False`` skips the backend's device check (meta tensors)."""
    _check_x(x)
    check_tensor(router_weight, "router_weight")
    check_ndim(router_weight, "router_weight", ndim=2,
               layout="[E, d_model]: torch.nn.Linear(d_model, E)'s weight")
    check_dtype(router_weight, "router_weight", FLOAT_DTYPES)
    E, d = router_weight.shape
    if E < 1 or d < 1:
        raise ValueError(f"router_weight: needs num_experts >= 1 and d_model >= 1, got "
                         f"{list(router_weight.shape)}")
    if x.shape[-1] != d:
        raise ValueError(f"x: last dim must be d_model={d}, got {list(x.shape)}")
    f = _check_experts_weights(x, w_gate_up, w_down, E, d)
    _check_top_k(top_k, E)
    check_flag(normalize_topk, "normalize_topk")
    coef = _check_coef(aux_loss_coef)
    T, top_k, device, plans = _check_routing(
        x, ("router_weight", router_weight), w_gate_up, w_down, E, d, f, top_k,
        normalize_topk, plans, plans_cls, resolve, launch)
    return T, E, d, f, top_k, coef, device, plans


def _check_experts(x, router_logits, w_gate_up, w_down, top_k, normalize_topk, plans,
                   plans_cls=MoEFeedForwardPlans, resolve=None, *, launch=True):
    """Every check of :func:`moe_experts_det` (no allocation, launch or sync)."""
    _check_x(x)
    check_tensor(w_gate_up, "w_gate_up")
    check_ndim(w_gate_up, "w_gate_up", ndim=3,
               layout="[E, 2 * d_ff, d_model]: E stacked torch.nn.Linear weights")
    E, d = w_gate_up.shape[0], x.shape[-1]
    if E < 1 or d < 1:
        raise ValueError(f"w_gate_up: needs num_experts >= 1 and x: d_model >= 1, got "
                         f"{list(w_gate_up.shape)} and {list(x.shape)}")
    f = _check_experts_weights(x, w_gate_up, w_down, E, d)
    check_tensor(router_logits, "router_logits")
    check_dtype(router_logits, "router_logits", FLOAT_DTYPES)
    check_shape(router_logits, "router_logits", [*x.shape[:-1], E],
                layout="[..., E]: x's leading dims by experts")
    T, top_k, device, plans = _check_routing(
        x, ("router_logits", router_logits), w_gate_up, w_down, E, d, f, top_k,
        normalize_topk, plans, plans_cls, resolve, launch)
    return T, E, d, f, top_k, device, plans


def moe_feed_forward_det(x: torch.Tensor, router_weight: torch.Tensor,
                         w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int, *,
                         normalize_topk: bool = True, aux_loss_coef: float = 0.01,
                         plans: MoEFeedForwardPlans | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic MoE feed-forward (top-k softmax router, SwiGLU experts), with autograd.

    Args:
        x: ``[..., d_model]`` tokens (T = product of the leading dims, T = 0 allowed), fp32,
            bf16 or fp16, any strides.
        router_weight: ``[E, d_model]`` (Megatron's ``router.weight``, Qwen3-MoE's and
            DeepSeek-V3's ``gate.weight``), fp32/bf16/fp16; the logits are computed in fp32
            (both operands cast to fp32, exact fp32 products).
        w_gate_up: ``[E, 2·d_ff, d_model]`` in x's dtype: expert e's gate projection in rows
            ``[0, d_ff)`` and its up projection in rows ``[d_ff, 2·d_ff)`` (stacked
            ``nn.Linear`` weights: Qwen3's ``gate_proj``/``up_proj``, Mixtral's ``w1``/``w3``).
        w_down: ``[E, d_model, d_ff]`` in x's dtype (``down_proj`` / ``w2``).
        top_k: experts per token, ``1 <= k <= E``.
        normalize_topk: renormalise each token's k weights to sum to 1.
        aux_loss_coef: weight of the load-balancing loss (>= 0; 0 gives a zero loss).
        plans: :class:`MoEFeedForwardPlans` (default: :func:`make_moe_plans`' rule per call).

    Returns:
        ``(y, aux_loss)``: y like x (``[..., d_model]``, x's dtype); ``aux_loss`` an fp32
        scalar (module docstring; differentiable in the router weight through P_e, f_e is
        a count). Gradients reach x, router_weight, w_gate_up and w_down.

    Numerics: the expert GEMMs accumulate in fp32 and store x's dtype (the grouped GEMM);
    SwiGLU runs in x's dtype (torch elementwise ops); router, softmax, top-k weights,
    combine and aux loss in fp32; y is cast once.

    Determinism: y, aux_loss and every gradient are bitwise repeatable for equal inputs,
    plans and hardware: fixed tie-break (lower expert index), stable sort, the grouped
    GEMMs' fixed orders, slot-order sums in the combine and in the permutation's backward,
    no floating atomics. Empty experts get exact-zero weight gradients.

    Raises:
        ValueError: before any launch: shapes (x's last dim, w_gate_up ``[E, 2f, d]``,
            w_down ``[E, d, f]``), dtypes (expert weights in x's dtype), devices, top_k,
            normalize_topk (a bool), aux_loss_coef, plans (type, mode, shapes: as
            :func:`moe_grouped_det_gemm`).
    """
    return _feed_forward(x, router_weight, w_gate_up, w_down, top_k, normalize_topk,
                         aux_loss_coef, plans)


def _experts(x2, logits, w_gate_up, w_down, k, normalize_topk, plans, gemm):
    """Routing, permutation, SwiGLU experts and combine of ``x2 [T, d]`` under ``logits
    [T, E]`` -> ``(y [T, d], routing)``."""
    r = moe_route_det(logits, k, normalize_topk=normalize_topk)
    xp = moe_permute_det(x2, r)
    h = gemm(xp, w_gate_up, r.offs, plan=plans.gate_up)
    a = swiglu(h)  # silu(gate) * up, one launch each way (dh written whole)
    out = gemm(a, w_down, r.offs, plan=plans.down)
    return moe_unpermute_det(out, r), r


def _feed_forward(x, router_weight, w_gate_up, w_down, top_k, normalize_topk, aux_loss_coef,
                  plans, *, gemm=None, plans_cls=MoEFeedForwardPlans, resolve=None):
    """:func:`moe_feed_forward_det` with the grouped GEMM over routed row ends
    (:func:`~cake_moe_grouped_det_gemm.api.routed_gemm`), the plans type and the plan check
    as arguments (the nondet sibling passes its own: the same layer on its GEMM)."""
    T, E, d, f, k, coef, device, plans = _check_layer(
        x, router_weight, w_gate_up, w_down, top_k, normalize_topk, aux_loss_coef, plans,
        plans_cls, resolve)
    gemm = gemm or routed_gemm
    x2 = x.reshape(T, d)
    rows_all = torch.full((1,), T, dtype=torch.int32, device=device)  # one group: rows [0, T)
    logits = gemm(x2.float(), router_weight.float()[None], rows_all, plan=plans.router)
    y, r = _experts(x2, logits, w_gate_up, w_down, k, normalize_topk, plans, gemm)
    if coef == 0.0:
        aux = r.probs.new_zeros(())
    else:
        counts = torch.diff(r.offs, prepend=r.offs.new_zeros(1)).float()
        frac = counts / max(T * k, 1)
        mean_p = r.probs.sum(0) / max(T, 1)
        aux = (coef * E) * (frac * mean_p).sum()
    return y.view(x.shape), aux


def moe_experts_det(x: torch.Tensor, router_logits: torch.Tensor, w_gate_up: torch.Tensor,
                    w_down: torch.Tensor, top_k: int, *, normalize_topk: bool = True,
                    plans: MoEFeedForwardPlans | None = None) -> torch.Tensor:
    """The experts half of :func:`moe_feed_forward_det`, for a router the caller runs: top-k
    softmax routing of ``router_logits``, SwiGLU experts, fixed-order combine.

    For models whose router is a module of their own (transformers' ``Qwen3NextTopKRouter``
    / ``Qwen3MoeTopKRouter``: ``F.linear(x, gate.weight)`` in the model's dtype): the logits
    come in as computed, the softmax and top-k run on them in fp32 (``torch.softmax(logits,
    dtype=float32)`` as transformers). Everything after the logits is
    :func:`moe_feed_forward_det`'s (module docstring; same kernels, same bits for equal
    logits); no aux loss (compute it from the logits where wanted).

    Args:
        x: ``[..., d_model]`` tokens (T = product of the leading dims, T = 0 allowed), fp32,
            bf16 or fp16, any strides.
        router_logits: ``[..., E]`` with x's leading dims, any floating dtype; its gradient
            flows back to the caller's router.
        w_gate_up, w_down, top_k, normalize_topk: as :func:`moe_feed_forward_det`.
        plans: :class:`MoEFeedForwardPlans` (its ``router`` plan is unused; default: the
            rule per call).

    Returns:
        y like x (``[..., d_model]``, x's dtype). Gradients reach x, router_logits,
        w_gate_up and w_down; bitwise repeatable as :func:`moe_feed_forward_det`.

    Raises:
        ValueError: before any launch: shapes (router_logits ``[..., E]`` with E from
            w_gate_up ``[E, 2f, d]``), dtypes, devices, top_k, normalize_topk, plans.

    Example::

        import torch
        from cake_moe_grouped_det_gemm import moe_experts_det
        x = torch.randn(6, 16, requires_grad=True)  # CPU: Triton's interpreter
        logits = x @ torch.randn(16, 4)  # the caller's router
        y = moe_experts_det(x, logits, torch.randn(4, 2 * 8, 16), torch.randn(4, 16, 8), 2)
        y.sum().backward()
    """
    return _experts_entry(x, router_logits, w_gate_up, w_down, top_k, normalize_topk, plans)


def _experts_entry(x, router_logits, w_gate_up, w_down, top_k, normalize_topk, plans, *,
                   gemm=None, plans_cls=MoEFeedForwardPlans, resolve=None):
    """:func:`moe_experts_det` with the GEMM, plans type and plan check as arguments (the
    nondet sibling passes its own)."""
    T, E, d, f, k, _, plans = _check_experts(x, router_logits, w_gate_up, w_down, top_k,
                                             normalize_topk, plans, plans_cls, resolve)
    y, _ = _experts(x.reshape(T, d), router_logits.reshape(T, E), w_gate_up, w_down, k,
                    normalize_topk, plans, gemm or routed_gemm)
    return y.view(x.shape)


class MoEFeedForward(nn.Module):
    """Deterministic mixture-of-experts feed-forward: top-k softmax router, SwiGLU experts
    on the det grouped GEMM, fixed-order combine, Switch load-balancing loss.

    ``MoEFeedForward(d_model, d_ff, num_experts, top_k, *, aux_loss_coef=0.01,
    normalize_topk=True, device=None, dtype=None)``; ``forward(x, *, plans=None)`` returns
    ``(y, aux_loss)`` as :func:`moe_feed_forward_det` (math and sources in this module's
    docstring). Names as Megatron / Qwen3-MoE: ``d_model`` = ``hidden_size``, ``d_ff`` =
    ``moe_intermediate_size`` (each expert's width), ``num_experts``, ``top_k`` =
    ``num_experts_per_tok``, ``normalize_topk`` = ``norm_topk_prob``.

    Parameters:
        router_weight: ``[E, d_model]``, as ``nn.Linear(d_model, E, bias=False)``'s init.
        w_gate_up: ``[E, 2·d_ff, d_model]``, gate rows first; each expert's rows as
            ``nn.Linear(d_model, d_ff)``'s init (uniform in ``±1/sqrt(d_model)``).
        w_down: ``[E, d_model, d_ff]``, uniform in ``±1/sqrt(d_ff)``.
    No biases (as Mixtral, Qwen3-MoE, DeepSeek-V3).

    To load per-expert Linear weights: ``w_gate_up[e] = cat([gate_proj.weight,
    up_proj.weight])``, ``w_down[e] = down_proj.weight``.

    Raises:
        ValueError: sizes < 1, top_k outside ``[1, num_experts]``, a bad ``aux_loss_coef``
            or ``normalize_topk`` (constructor); bad inputs as :func:`moe_feed_forward_det`
            (forward, before any launch).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int, *,
                 aux_loss_coef: float = 0.01, normalize_topk: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        for name, v in (("d_model", d_model), ("d_ff", d_ff), ("num_experts", num_experts)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        self.d_model, self.d_ff, self.num_experts = int(d_model), int(d_ff), int(num_experts)
        self.top_k = _check_top_k(top_k, self.num_experts)
        self.aux_loss_coef = _check_coef(aux_loss_coef)
        self.normalize_topk = check_flag(normalize_topk, "normalize_topk")
        kw = {"device": device, "dtype": dtype}
        E, d, f = self.num_experts, self.d_model, self.d_ff
        self.router_weight = nn.Parameter(torch.empty((E, d), **kw))
        self.w_gate_up = nn.Parameter(torch.empty((E, 2 * f, d), **kw))
        self.w_down = nn.Parameter(torch.empty((E, d, f), **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s default init per expert matrix: uniform in ``±1/sqrt(fan_in)``."""
        with torch.no_grad():
            for p, fan_in in ((self.router_weight, self.d_model),
                              (self.w_gate_up, self.d_model), (self.w_down, self.d_ff)):
                bound = 1.0 / math.sqrt(fan_in)
                p.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor, *, plans: MoEFeedForwardPlans | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return moe_feed_forward_det(
            x, self.router_weight, self.w_gate_up, self.w_down, self.top_k,
            normalize_topk=self.normalize_topk, aux_loss_coef=self.aux_loss_coef, plans=plans)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, aux_loss_coef={self.aux_loss_coef}, "
                f"normalize_topk={self.normalize_topk}")
