"""Autograd entry (custom ops + register_autograd) and the low-level fwd/bwd of the det
LM-head loss: cross entropy of ``hidden @ weight.T (+ bias)`` against ``labels``.

Math (s the logits, soft-capped s = c tanh(z / c) when ``logit_softcap`` = c is set, Gemma 2;
p = softmax(s); eps the label smoothing; zl the z-loss coefficient, PaLM):
    loss_t  = lse_t - (1 - eps) s_{t,y} - eps/V sum_j s_{t,j} + zl lse_t^2   (ignored: 0)
    dlogits = g_t (p (1 + 2 zl lse) - (1 - eps) onehot(y) - eps/V) (1 - (s/c)^2)
    dhidden = dlogits @ W;  dweight = sum over chunks (in order) of dlogits_c^T @ h_c;
    dbias   = ordered sum of dlogits over tokens.
Tokens run in chunks of ``plan.chunk_tokens``: only ``[chunk, V]`` logits ever exist.
GEMMs: cake_core.gemm; the softmax/CE part: kernels/ce.py; the loss sum: kernels/reduce.py.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_accumulator,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.compile import plan_from_op_fields, plan_to_op_fields
from cake_core.gemm import (
    TMA_MAX_BOX,
    matmul,
    ordered_sum,
    tma_available,
    tma_readable,
)
from cake_core.triton_utils import launch_device_check

from cake_lm_head_loss_det_train.kernels.ce import ce_chunk_kernel
from cake_lm_head_loss_det_train.kernels.reduce import loss_sum_kernel
from cake_lm_head_loss_det_train.plan import (
    MAX_HIDDEN,
    MAX_VOCAB,
    REDUCTIONS,
    LMHeadLossDetPlan,
    make_plan,
)
from cake_lm_head_loss_det_train.saved import (
    LMHeadLossDetSavedSet,
    LMHeadLossDetWorkspace,
    workspace_buffers,
)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_RED = {"none": 0, "mean": 1, "sum": 2}
_NONE, _MEAN, _SUM = 0, 1, 2


class LMHeadLossDetGrads(NamedTuple):
    """Gradients of :func:`lm_head_loss_det_bwd`; ``None`` where there is none.

    dhidden: like hidden. dweight: like weight (``None`` when ``main_grad`` received it).
    dbias: like bias, only with a bias.
    """

    dhidden: torch.Tensor | None
    dweight: torch.Tensor | None
    dbias: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class ModeClasses:
    """What one mode's entry points are bound to: this package's det classes and custom
    ops (:data:`DET`), or a non-deterministic sibling's (``cake_lm_head_loss_nondet_train``,
    which runs these launches under its own plan, saved set, workspace, gradients and
    custom-op namespace). Not public API.

    Fields: ``mode``; ``plan`` (:class:`LMHeadLossDetPlan` or a subclass carrying
    ``mode``), ``saved``, ``workspace``, ``grads``: the classes the entries take and
    return; ``make_plan``: the plan rule (``None``: this module's :func:`make_plan`,
    looked up per call); ``op_namespace``: the custom ops' namespace (see
    :func:`register_ops`); ``entry``: the autograd entry's name, for messages; ``alert``:
    called before any backward launch (a nondet sibling's deterministic-algorithms alert),
    or ``None``; ``function``: the eager autograd Function (a subclass of this module's,
    named for the mode; ``None``: this module's).
    """

    mode: Mode
    plan: type
    saved: type
    workspace: type
    grads: type
    make_plan: Callable | None
    op_namespace: str
    entry: str
    alert: Callable[[], None] | None = None
    function: type | None = None


# ----------------------------------------------------------------------------- checks


def _check_scalar(v, name: str, lo: float, hi: float | None = None) -> float:
    # not math.isfinite: under torch.compile(dynamic=True) v may be a SymFloat
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not abs(v) < math.inf or \
            v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}: expected a finite number {rng}, got {v!r}")
    return float(v)


def _check_main_grad(main_grad, V: int, H: int) -> None:
    check_accumulator(main_grad, "main_grad", (V, H))


def _check_inputs(hidden, weight, labels, bias, ignore_index, reduction, label_smoothing,
                  z_loss, logit_softcap, main_grad, *, launch: bool = True):
    """Returns (device, cfg) with cfg = (ignore_index, reduction code, label_smoothing,
    z_loss, softcap or 0.0)."""
    check_tensor(hidden, "hidden")
    if hidden.dim() not in (2, 3):
        raise ValueError(f"hidden: expected a 2-D [T, H] or 3-D [B, S, H] tensor, got "
                         f"{hidden.dim()}-D {tuple(hidden.shape)}")
    check_dtype(hidden, "hidden", _FLOATS)
    H = hidden.shape[-1]
    if not 1 <= H <= MAX_HIDDEN:
        raise ValueError(f"hidden: last dimension (H) must be in [1, {MAX_HIDDEN}], got {H}")
    check_last_dim_contiguous(hidden, "hidden")
    check_tensor(weight, "weight")
    if weight.dim() != 2 or weight.shape[1] != H:
        raise ValueError(f"weight: expected shape [V, {H}] ([V, H] = [vocab, hidden], "
                         f"torch.nn.Linear's layout of the LM head; a transposed [H, V] is "
                         f"not served), got {list(weight.shape)}")
    V = weight.shape[0]
    if not 1 <= V <= MAX_VOCAB:
        raise ValueError(f"weight: vocabulary size (V) must be in [1, {MAX_VOCAB}], got {V}")
    check_dtype(weight, "weight", (hidden.dtype,))
    check_last_dim_contiguous(weight, "weight")
    check_tensor(labels, "labels")
    check_dtype(labels, "labels", (torch.int64,))
    check_shape(labels, "labels", list(hidden.shape[:-1]),
                layout="hidden's leading dims: [T] or [B, S], one label per token")
    if bias is not None:
        check_tensor(bias, "bias")
        check_shape(bias, "bias", [V], layout="[V]: one bias per vocabulary row of weight")
        check_dtype(bias, "bias", (hidden.dtype, torch.float32))
        if not bias.is_contiguous():
            raise ValueError("bias: must be contiguous")
    cfg = check_options(ignore_index, reduction, label_smoothing, z_loss, logit_softcap)
    _check_main_grad(main_grad, V, H)
    device = check_same_device(("hidden", hidden), ("weight", weight), ("labels", labels),
                               ("bias", bias), ("main_grad", main_grad))
    if launch:  # off for the size queries, which serve meta tensors
        launch_device_check(device, "hidden")
    return device, cfg


def check_options(ignore_index, reduction, label_smoothing, z_loss, logit_softcap) -> tuple:
    """The loss options' checks (the entries' and :class:`LMHeadLoss`'s) -> the kernels'
    ``(ignore_index, reduction code, label_smoothing, z_loss, softcap or 0)``."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral) or \
            not -(2**63) <= ignore_index < 2**63:
        raise ValueError(f"ignore_index: expected an int, got {ignore_index!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {REDUCTIONS}, got {reduction!r}")
    ls = _check_scalar(label_smoothing, "label_smoothing", 0.0, 1.0)
    zl = _check_scalar(z_loss, "z_loss", 0.0)
    cap = 0.0
    if logit_softcap is not None:
        cap = _check_scalar(logit_softcap, "logit_softcap", 0.0)
        if cap <= 0.0:
            raise ValueError(f"logit_softcap: expected None or a finite number > 0, got "
                             f"{logit_softcap!r}")
    return int(ignore_index), _RED[reduction], ls, zl, cap


def _check_labels(labels: torch.Tensor, V: int, ignore_index: int) -> None:
    """One reduction and one host sync: labels outside [0, V) other than ignore_index."""
    if labels.numel() == 0:
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    if bool(bad.any()):
        first = int(labels[bad].reshape(-1)[0])
        raise ValueError(f"labels: values must be in [0, {V}) or ignore_index={ignore_index}, "
                         f"got {first}")


def _resolve_plan(plan, H: int, V: int, dtype, device, reduction: str,
                  m: ModeClasses | None = None):
    """The call's plan: ``plan`` (checked) or the mode's rule; ``m``: the mode's classes
    (default :data:`DET`)."""
    m = m or DET
    if plan is None:
        return (m.make_plan or make_plan)(H, V, dtype, device, reduction=reduction)
    require_mode(plan, m.plan, m.mode, name="plan")
    if plan.hidden_size != H or plan.vocab_size != V:
        raise ValueError(f"plan: made for hidden_size={plan.hidden_size}, vocab_size="
                         f"{plan.vocab_size}; inputs have H={H}, V={V}")
    if plan.grad_in_forward and reduction == "none":
        raise ValueError("plan: grad_in_forward=1 needs reduction 'mean' or 'sum' (per-token "
                         "upstream gradients exist only at backward time)")
    # meta tensors come from the size queries, which serve a CUDA plan
    if plan.cublas_gemms and (device.type not in ("cuda", "meta") or
                              dtype not in (torch.bfloat16, torch.float16)):
        raise ValueError(f"plan: cublas_gemms=1 needs bf16/fp16 inputs on CUDA, got "
                         f"{str(dtype)[6:]} on {device.type}")
    if plan.dw_tma:
        es = dtype.itemsize
        if (H * es) % 16 or (V * es) % 16:
            raise ValueError(f"plan: dw_tma=1 needs hidden_size H and vocab_size V to be "
                             f"multiples of {16 // es} for {str(dtype)[6:]} (TMA reads 16-byte "
                             f"aligned rows), got H={H}, V={V}; use dw_tma=0")
        if not tma_available():
            raise ValueError("plan: dw_tma=1 needs Triton >= 3.4 (triton.tools."
                             "tensor_descriptor); use dw_tma=0")
        tiles = tuple(getattr(plan, f"dw_block_{d}") for d in "mnk")
        if max(tiles) > TMA_MAX_BOX:  # else the dweight GEMM refuses after the forward ran
            raise ValueError(f"plan: dw_tma=1 needs dw_block_m, dw_block_n and dw_block_k "
                             f"<= {TMA_MAX_BOX} (a TMA box edge), got {tiles}; use dw_tma=0 "
                             f"or smaller tiles")
    return plan


def _resolve_workspace(workspace, plan: LMHeadLossDetPlan, device, dtype,
                       m: ModeClasses | None = None):
    """(logits, dlogits, dh_partials) buffers, or (None, None, None) without a workspace.
    ``m``: the mode's classes (default :data:`DET`)."""
    if workspace is None:
        return None, None, None
    m = m or DET
    require_mode(workspace, m.workspace, m.mode, name="workspace")
    workspace.check(plan, device)
    want = workspace_buffers(plan, dtype, plan_cls=m.plan)
    for name, (shape, dt) in want.items():
        t = workspace[name] if name in workspace.names else None
        if t is None or tuple(t.shape) != shape or t.dtype != dt or not t.is_contiguous():
            got = "missing" if t is None else f"{str(t.dtype)[6:]} {list(t.shape)}"
            raise ValueError(
                f"workspace: {name!r} must be a contiguous {str(dt)[6:]} tensor of shape "
                f"{list(shape)}, got {got}; build it with "
                f"{m.workspace.__name__}.for_plan(plan, device, dtype)")
    return (workspace["logits"], workspace["dlogits"] if "dlogits" in want else None,
            workspace["dh_partials"] if "dh_partials" in want else None)


# ----------------------------------------------------------------------------- launches


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _gemm_kw(plan: LMHeadLossDetPlan, which: str) -> dict:
    kw = dict(block_m=getattr(plan, f"{which}_block_m"),
              block_n=getattr(plan, f"{which}_block_n"),
              block_k=getattr(plan, f"{which}_block_k"), group_m=plan.gemm_group_m,
              num_warps=plan.gemm_warps, num_stages=plan.gemm_stages)
    if which == "dw" and plan.dw_tma:
        kw["tma"] = True
    return kw


def _tma_ready(t: torch.Tensor, plan: LMHeadLossDetPlan) -> torch.Tensor:
    """``t``, or (with the plan's TMA dweight) a contiguous copy where TMA cannot read its
    layout (a view at an unaligned start or with an unaligned row stride)."""
    return tma_readable(t) if plan.dw_tma else t


def _buffers(plan, h2, bufs, need_dlogits=True):
    logits, dlogits, dh_parts = bufs
    C, V, H = plan.chunk_tokens, plan.vocab_size, plan.hidden_size
    dev = h2.device
    if logits is None:
        logits = torch.empty((min(C, h2.shape[0]), V), dtype=torch.float32, device=dev)
    if dlogits is None and h2.dtype != torch.float32 and need_dlogits:
        dlogits = torch.empty((logits.shape[0], V), dtype=h2.dtype, device=dev)
    if dh_parts is None and plan.dh_split > 1:
        dh_parts = torch.empty((plan.dh_split * logits.shape[0] * H,), dtype=torch.float32,
                               device=dev)
    return logits, dlogits, dh_parts


def _run_chunks(h2, weight, bias, labels1, cfg, plan, bufs, *, fwd, g, g_kind, n_valid,
                loss_tok, lse, dh, dw32, db32, dl_all=None):
    """The chunk loop. fwd: write loss_tok and lse; g_kind/g: the upstream gradient of the
    CE kernel (-1: no gradient); dh / dw32 / db32: None or where the gradients go (dw32 and
    db32 are written by the first chunk and accumulated in fp32 by the next ones);
    dl_all: ``[T, V]`` 16-bit, where each chunk's dlogits are kept (the deferred-dweight
    route; then dw32 is None)."""
    ignore_index, red, ls, zl, cap = cfg
    T, H = h2.shape
    V = weight.shape[0]
    logits, dlogits, dh_parts = _buffers(plan, h2, bufs, need_dlogits=dl_all is None)
    grad = g_kind >= 0
    kw_logits, kw_dh, kw_dw = (_gemm_kw(plan, k) for k in ("logits", "dh", "dw"))
    if dw32 is not None:  # the TMA dweight reads row slices of h2: aligned if h2 is
        h2 = _tma_ready(h2, plan)
    wt = weight.t()
    cublas = bool(plan.cublas_gemms)
    for t0 in range(0, T, plan.chunk_tokens):
        t1 = min(T, t0 + plan.chunk_tokens)
        n = t1 - t0
        hc = h2[t0:t1]
        lg = logits[:n]
        if cublas:
            torch.mm(hc, wt, out_dtype=torch.float32, out=lg)
            if bias is not None:
                lg.add_(bias)
        else:
            matmul(hc, wt, lg, bias=bias, **kw_logits)
        if dl_all is not None:
            dl = dl_all[t0:t1]
        else:
            dl = (dlogits[:n] if dlogits is not None else lg) if grad else lg
        ce_chunk_kernel[(_cdiv(n, plan.block_m),)](
            lg, dl, labels1[t0:t1], loss_tok[t0:t1] if fwd else lg,
            lse[t0:t1], (g[t0:t1] if g_kind == 2 else g) if g is not None else lg, n_valid,
            n, V, lg.stride(0), dl.stride(0), ignore_index, ls, zl, cap if cap > 0 else 1.0,
            FWD=fwd, GRAD=grad, G_KIND=max(g_kind, 0), MEAN=red == _MEAN, SOFTCAP=cap > 0,
            STORE_F32=grad and db32 is not None and (dlogits is not None or dl_all is not None),
            BLOCK_M=plan.block_m, BLOCK_V=plan.block_v, num_warps=plan.num_warps,
        )
        if not grad:
            continue
        if dh is not None:
            parts = None
            if plan.dh_split > 1:
                parts = dh_parts[: plan.dh_split * n * H].view(plan.dh_split, n, H)
            if cublas and plan.dh_split == 1:
                torch.mm(dl, weight, out=dh[t0:t1])
            else:
                matmul(dl, weight, dh[t0:t1], split=plan.dh_split, partials=parts, **kw_dh)
        if dw32 is not None:
            matmul(_tma_ready(dl, plan).t(), hc, dw32, accumulate=t0 > 0, **kw_dw)
        if db32 is not None:  # lg now holds the fp32 dlogits of the chunk
            if t0 == 0:
                ordered_sum(lg, out=db32)
            else:
                ordered_sum(lg, accumulate_into=db32)


def _forward_impl(h2, weight, bias, labels1, cfg, plan, bufs, need_dh, need_dw, need_db):
    """Returns (loss, lse, n_valid, dh, dw32, db32); the last three are empty ``(0,)``
    tensors unless the plan computes gradients in the forward and they are needed. On the
    deferred-dweight route ``dw32`` holds the 16-bit dlogits ``[T, V]`` instead of the fp32
    ``[V, H]`` sum (told apart by dtype)."""
    ignore_index, red, _, _, _ = cfg
    T, H = h2.shape
    V = weight.shape[0]
    dev = h2.device
    n_valid = (labels1 != ignore_index).sum()
    loss_tok = torch.empty((T,), dtype=torch.float32, device=dev)
    lse = torch.empty((T,), dtype=torch.float32, device=dev)
    gif = bool(plan.grad_in_forward) and red != _NONE
    need_db = need_db and bias is not None
    empty = lambda dt: torch.empty((0,), dtype=dt, device=dev)
    dh = torch.empty((T, H), dtype=h2.dtype, device=dev) if gif and need_dh else empty(h2.dtype)
    defer = gif and need_dw and h2.dtype != torch.float32 and 0 < T <= plan.defer_dw_tokens
    if defer:  # keep the dlogits; the backward makes dweight in one GEMM (plan docstring)
        dw32 = torch.empty((T, V), dtype=h2.dtype, device=dev)
    elif gif and need_dw:
        dw32 = torch.empty((V, H), dtype=torch.float32, device=dev)
    else:
        dw32 = empty(torch.float32)
    db32 = torch.empty((V,), dtype=torch.float32, device=dev) if gif and need_db \
        else empty(torch.float32)
    any_grad = gif and (need_dh or need_dw or need_db)
    if T > 0:
        _run_chunks(h2, weight, bias, labels1, cfg, plan, bufs, fwd=True, g=None,
                    g_kind=0 if any_grad else -1, n_valid=n_valid, loss_tok=loss_tok, lse=lse,
                    dh=dh if gif and need_dh else None,
                    dw32=dw32 if gif and need_dw and not defer else None,
                    db32=db32 if gif and need_db else None, dl_all=dw32 if defer else None)
    else:
        dw32.zero_()
        db32.zero_()
    if red == _NONE:
        loss = loss_tok
    else:
        loss = torch.empty((), dtype=torch.float32, device=dev)
        if T == 0:
            loss.zero_()
        else:
            loss_sum_kernel[(1,)](loss_tok, n_valid, loss, T, MEAN=red == _MEAN,
                                  BLOCK=plan.loss_block, num_warps=4)
    return loss, lse, n_valid, dh, dw32, db32


def _scaled_rows(src32, g, dst, *, accumulate: bool, rows_per_step: int = 0):
    """``dst = (src32 * g).to(dst.dtype)`` or ``dst += src32 * g`` (fp32), in row blocks so
    the fp32 product never exists whole: the same elementwise roundings as the one-shot
    torch expression (product rounded to fp32, then the cast or the add), hence the same
    bits, with a transient of at most ~64 MiB."""
    V, H = src32.shape
    step = rows_per_step or max(1, (1 << 24) // max(H, 1))
    for r0 in range(0, V, step):
        prod = src32[r0:r0 + step] * g
        if accumulate:
            dst[r0:r0 + step].add_(prod)
        else:
            dst[r0:r0 + step].copy_(prod)
    return dst


def _backward_impl(dloss, h2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s, db32_s, cfg,
                   plan, bufs, main_grad, need_dh, need_dw, need_db, gif, inplace=False):
    """Returns (dh, dw, db) as tensors, empty ``(0,)`` where not needed (dw also when
    main_grad took it). ``gif``: the forward computed the gradients (dh_s, dw32_s, db32_s).
    ``inplace`` (the eager path): scale the saved dh_s and fp32 dw32_s in place instead of
    into new tensors (the same roundings, so the same bits; dh is then dh_s itself), which
    keeps the backward's peak at the saved gradients plus the new dweight; autograd's version
    check then refuses a second backward through the same graph. The custom-op path keeps
    copies (an op's outputs may not alias its inputs)."""
    red = cfg[1]
    T, H = h2.shape
    V = weight.shape[0]
    dev = h2.device
    need_db = need_db and bias is not None
    empty = lambda dt: torch.empty((0,), dtype=dt, device=dev)
    if gif:  # gradients of the loss for g = 1 exist: scale by the scalar upstream gradient
        g = dloss.reshape(()).to(torch.float32)
        dh = (dh_s.mul_(g) if inplace else dh_s * g) if need_dh else empty(h2.dtype)
        db = (db32_s * g).to(bias.dtype) if need_db else empty(torch.float32)
        if not need_dw:
            dw = empty(weight.dtype)
        elif dw32_s.dtype != torch.float32:  # deferred route: dw32_s is dlogits [T, V]
            g1 = g.reshape(1)
            kw = _gemm_kw(plan, "dw")
            # either may be a view at an unaligned start (saved-tensor hooks, a saved set
            # rebuilt from tensors): copied for TMA, as the pointer loads read them
            h2, dw32_s = _tma_ready(h2, plan), _tma_ready(dw32_s, plan)
            if main_grad is not None:
                matmul(dw32_s.t(), h2, main_grad, accumulate=True, scale=g1, **kw)
                dw = empty(weight.dtype)
            else:
                dw = matmul(dw32_s.t(), h2, torch.empty_like(weight), scale=g1, **kw)
        elif inplace:
            dw32_s.mul_(g)
            if main_grad is not None:
                main_grad.add_(dw32_s)
                dw = empty(weight.dtype)
            else:
                dw = dw32_s.to(weight.dtype)
        elif main_grad is not None:
            _scaled_rows(dw32_s, g, main_grad, accumulate=True)
            dw = empty(weight.dtype)
        else:
            dw = _scaled_rows(dw32_s, g, torch.empty_like(weight), accumulate=False)
        return dh, dw, db
    # recompute: the logits again, chunk by chunk, with the upstream gradient in the kernel
    dh = torch.empty((T, H), dtype=h2.dtype, device=dev) if need_dh else None
    dw32 = None
    if need_dw:
        dw32 = torch.empty((V, H), dtype=torch.float32, device=dev)
    db32 = torch.empty((V,), dtype=torch.float32, device=dev) if need_db else None
    if T > 0 and (need_dh or need_dw or need_db):
        gk = 2 if red == _NONE else 1
        g = dloss.reshape(-1 if red == _NONE else ()).to(torch.float32).contiguous()
        _run_chunks(h2, weight, bias, labels1, cfg, plan, bufs, fwd=False, g=g,
                    g_kind=gk, n_valid=n_valid, loss_tok=None, lse=lse, dh=dh, dw32=dw32,
                    db32=db32)
    else:
        for t in (dh, dw32, db32):
            if t is not None:
                t.zero_()
    dh = dh if dh is not None else empty(h2.dtype)
    db = db32.to(bias.dtype) if db32 is not None else empty(torch.float32)
    if dw32 is None:
        dw = empty(weight.dtype)
    elif main_grad is not None:
        main_grad.add_(dw32)  # the fp32 chunk-ordered sum, added once
        dw = empty(weight.dtype)
    else:
        dw = dw32.to(weight.dtype)
    return dh, dw, db


# ----------------------------------------------------------------------------- custom ops

def register_ops(m: ModeClasses):
    """Register ``<m.op_namespace>::fwd`` / ``::bwd`` (what torch.compile traces) with their
    fake implementations and the autograd formula, for the plans of ``m.plan`` carrying
    ``m.mode``; ``m.alert`` (if any) runs in the backward before any launch. Returns the
    two ops. This package registers :data:`DET`'s at import; a nondet sibling its own."""
    ns = m.op_namespace

    # The forward op must be functional to carry an autograd formula: it receives the
    # workspace buffers only to save them for the backward op (which mutates them) and
    # allocates its own chunk buffers. The eager path uses the workspace in both directions.
    @torch.library.custom_op(f"{ns}::fwd", mutates_args=())
    def _fwd_op(hidden2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                labels1: torch.Tensor, ignore_index: int, reduction: int, label_smoothing: float,
                z_loss: float, logit_softcap: float, plan_fields: list[int],
                logits_ws: torch.Tensor | None, dlogits_ws: torch.Tensor | None,
                dh_partials_ws: torch.Tensor | None, main_grad: torch.Tensor | None,
                check_labels: bool, need_dh: bool, need_dw: bool, need_db: bool,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor]:
        plan = plan_from_op_fields(m.plan, plan_fields, m.mode)
        if check_labels:
            _check_labels(labels1, weight.shape[0], ignore_index)
        cfg = (ignore_index, reduction, label_smoothing, z_loss, logit_softcap)
        return _forward_impl(hidden2, weight, bias, labels1, cfg, plan, (None, None, None),
                             need_dh, need_dw, need_db)

    @_fwd_op.register_fake
    def _fwd_fake(hidden2, weight, bias, labels1, ignore_index, reduction, label_smoothing,
                  z_loss, logit_softcap, plan_fields, logits_ws, dlogits_ws, dh_partials_ws,
                  main_grad, check_labels, need_dh, need_dw, need_db):
        T, H = hidden2.shape
        V = weight.shape[0]
        plan = plan_from_op_fields(m.plan, plan_fields, m.mode)
        gif = bool(plan.grad_in_forward) and reduction != _NONE
        f32 = torch.float32
        loss = hidden2.new_empty((T,) if reduction == _NONE else (), dtype=f32)
        return (loss, hidden2.new_empty((T,), dtype=f32), hidden2.new_empty((), dtype=torch.int64),
                hidden2.new_empty((T, H) if gif and need_dh else (0,)),
                (hidden2.new_empty((T, V)) if hidden2.dtype != f32 and 0 < T <= plan.defer_dw_tokens
                 else hidden2.new_empty((V, H), dtype=f32)) if gif and need_dw
                else hidden2.new_empty((0,), dtype=f32),
                hidden2.new_empty((V,) if gif and need_db and bias is not None else (0,),
                                  dtype=f32))

    @torch.library.custom_op(f"{ns}::bwd",
                             mutates_args=("logits_ws", "dlogits_ws", "dh_partials_ws",
                                           "main_grad"))
    def _bwd_op(dloss: torch.Tensor, hidden2: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, labels1: torch.Tensor, lse: torch.Tensor,
                n_valid: torch.Tensor, dh_s: torch.Tensor, dw32_s: torch.Tensor,
                db32_s: torch.Tensor, ignore_index: int, reduction: int, label_smoothing: float,
                z_loss: float, logit_softcap: float, plan_fields: list[int],
                logits_ws: torch.Tensor | None, dlogits_ws: torch.Tensor | None,
                dh_partials_ws: torch.Tensor | None, main_grad: torch.Tensor | None,
                need_dh: bool, need_dw: bool, need_db: bool,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if m.alert is not None:
            m.alert()
        plan = plan_from_op_fields(m.plan, plan_fields, m.mode)
        cfg = (ignore_index, reduction, label_smoothing, z_loss, logit_softcap)
        return _backward_impl(dloss, hidden2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s,
                              db32_s, cfg, plan, (logits_ws, dlogits_ws, dh_partials_ws), main_grad,
                              need_dh, need_dw, need_db,
                              bool(plan.grad_in_forward) and reduction != _NONE)

    @_bwd_op.register_fake
    def _bwd_fake(dloss, hidden2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s, db32_s,
                  ignore_index, reduction, label_smoothing, z_loss, logit_softcap, plan_fields,
                  logits_ws, dlogits_ws, dh_partials_ws, main_grad, need_dh, need_dw, need_db):
        dh = hidden2.new_empty(hidden2.shape if need_dh else (0,))
        dw = weight.new_empty(weight.shape if need_dw and main_grad is None else (0,))
        has_db = need_db and bias is not None
        db = (bias.new_empty(bias.shape) if has_db
              else hidden2.new_empty((0,), dtype=torch.float32))
        return dh, dw, db

    def _setup_context(ctx, inputs, output):
        (hidden2, weight, bias, labels1, ii, red, ls, zl, cap, plan_fields, lws, dws, pws, mg, _chk,
         need_dh, need_dw, need_db) = inputs
        _, lse, n_valid, dh, dw32, db32 = output
        ctx.args = (ii, red, ls, zl, cap, plan_fields)
        ctx.needs = (need_dh, need_dw, need_db)
        ctx.save_for_backward(hidden2, weight, bias, labels1, lse, n_valid, dh, dw32, db32, lws,
                              dws, pws, mg)

    def _backward(ctx, dloss, dlse, dn, ddh, ddw, ddb):
        if m.alert is not None:
            m.alert()
        (hidden2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s, db32_s, lws, dws, pws,
         mg) = ctx.saved_tensors
        dh, dw, db = _bwd_op(
            dloss, hidden2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s, db32_s, *ctx.args,
            lws, dws, pws, mg, *ctx.needs)
        need_dh, need_dw, need_db = ctx.needs
        return ((dh if need_dh else None), (dw if need_dw and mg is None else None),
                (db if need_db and bias is not None else None), *([None] * 15))

    _fwd_op.register_autograd(_backward, setup_context=_setup_context)
    return _fwd_op, _bwd_op


class _LMHeadLossDetFunction(torch.autograd.Function):
    """Eager path (lower host overhead than the custom op); same launches, same bits.

    Workspace buffers and ``main_grad`` stay on ctx as attributes, not saved tensors, so
    reusing them across calls before the backward does not trip autograd's version check.
    ``m``: the mode's classes (its ``alert`` runs first in the backward; ``entry`` names the
    entry in messages)."""

    @staticmethod
    def forward(ctx, hidden2, weight, bias, labels1, cfg, plan, bufs, main_grad, needs, m):
        loss, lse, n_valid, dh, dw32, db32 = _forward_impl(hidden2, weight, bias, labels1, cfg,
                                                           plan, bufs, *needs)
        ctx.cfg, ctx.plan, ctx.bufs, ctx.main_grad, ctx.needs = cfg, plan, bufs, main_grad, needs
        ctx.has_bias, ctx.m = bias is not None, m
        ctx.save_for_backward(hidden2, weight, bias, labels1, lse, n_valid, dh, dw32, db32)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss, dlse):
        if ctx.m.alert is not None:
            ctx.m.alert()
        gif = bool(ctx.plan.grad_in_forward) and ctx.cfg[1] != _NONE
        if gif and getattr(ctx, "scaled_in_place", False):
            # autograd's version check refuses this already, unless saved-tensor hooks
            # (save_on_cpu, ...) bypass it: never scale the kept gradients twice
            raise RuntimeError(
                f"{ctx.m.entry}: a second backward through the same graph "
                "(retain_graph=True) is not supported on the grad-in-forward route: its "
                "backward scales the kept gradients in place; use a plan with "
                "grad_in_forward=0 (or reduction='none') to backward twice")
        hidden2, weight, bias, labels1, lse, n_valid, dh_s, dw32_s, db32_s = ctx.saved_tensors
        need_dh, need_dw, need_db = ctx.needs
        ctx.scaled_in_place = gif
        dh, dw, db = _backward_impl(dloss, hidden2, weight, bias, labels1, lse, n_valid, dh_s,
                                    dw32_s, db32_s, ctx.cfg, ctx.plan, ctx.bufs, ctx.main_grad,
                                    need_dh, need_dw, need_db, gif, inplace=True)
        return ((dh if need_dh else None),
                (dw if need_dw and ctx.main_grad is None else None),
                (db if need_db and ctx.has_bias else None), None, None, None, None, None, None,
                None)


#: this package's mode classes and custom ops
DET = ModeClasses(Mode.DET, LMHeadLossDetPlan, LMHeadLossDetSavedSet, LMHeadLossDetWorkspace,
                  LMHeadLossDetGrads, None, "cake_lm_head_loss_det_train", "lm_head_loss_det")
_fwd_op, _bwd_op = register_ops(DET)


# ----------------------------------------------------------------------------- public API


def _prepare(hidden, weight, labels, bias, ignore_index, reduction, label_smoothing, z_loss,
             logit_softcap, plan, workspace, main_grad, m, *, launch: bool = True):
    """Every check the entries make before reading label values or launching (also
    :func:`is_supported`'s) -> ``(device, cfg, plan, bufs)``; ``m``: the mode's classes;
    ``launch=False`` skips the backend's device check (size queries)."""
    device, cfg = _check_inputs(hidden, weight, labels, bias, ignore_index, reduction,
                                label_smoothing, z_loss, logit_softcap, main_grad,
                                launch=launch)
    H = hidden.shape[-1]
    V = weight.shape[0]
    plan = _resolve_plan(plan, H, V, hidden.dtype, device, reduction, m)
    bufs = _resolve_workspace(workspace, plan, device, hidden.dtype, m)
    return device, cfg, plan, bufs


def lm_head_loss_det(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                     bias: torch.Tensor | None = None, ignore_index: int = -100,
                     reduction: str = "mean", label_smoothing: float = 0.0,
                     z_loss: float = 0.0, logit_softcap: float | None = None,
                     return_lse: bool = False, plan: LMHeadLossDetPlan | None = None,
                     workspace: LMHeadLossDetWorkspace | None = None,
                     main_grad: torch.Tensor | None = None):
    """Deterministic fused LM head + cross entropy with autograd, never materializing the
    whole ``[T, V]`` logits.

    Equals ``F.cross_entropy((hidden @ weight.T + bias).float(), labels, ignore_index=...,
    reduction=..., label_smoothing=...)``, plus ``z_loss * lse**2`` per non-ignored token
    (PaLM) and, with ``logit_softcap`` = c, logits soft-capped to ``c * tanh(z / c)``
    first (Gemma 2; the lse of the capped logits enters the z-loss). "mean" divides by the
    count of non-ignored tokens; with none, the loss is 0 and every gradient 0 (never NaN).

    Args:
        hidden: ``[T, H]`` or ``[B, S, H]``, fp32, bf16 or fp16, last dim contiguous;
            1 <= H <= 65536.
        weight: ``[V, H]``, hidden's dtype, last dim contiguous; 1 <= V <= 2**22.
        labels: int64, hidden's leading shape; values in ``[0, V)`` or ``ignore_index``.
        bias: optional ``[V]``, hidden's dtype or fp32, contiguous.
        ignore_index: label value whose tokens count for nothing (default -100).
        reduction: "mean" (default), "sum" or "none" (per-token fp32 losses, labels' shape).
        label_smoothing: in [0, 1], as torch's. z_loss: coefficient >= 0 (0: off).
        logit_softcap: ``None`` (off) or c > 0.
        return_lse: also return the fp32 logsumexp of every token's (capped) logits,
            labels' shape (computed for ignored tokens too; not differentiable).
        plan: an :class:`LMHeadLossDetPlan` for (H, V) (default: :func:`make_plan`).
        workspace: an :class:`LMHeadLossDetWorkspace` for that plan and hidden's dtype
            (default: chunk buffers allocated per call).
        main_grad: optional fp32 ``[V, H]`` (Megatron's ``main_grad``): the backward adds
            the fp32 dweight into it once and ``weight`` gets no autograd gradient.

    Returns:
        ``loss`` (fp32; ``[]`` for "mean"/"sum", labels' shape for "none"), or
        ``(loss, lse)`` with ``return_lse``.

    Determinism: loss, lse and every gradient are bitwise repeatable for equal inputs,
    plan, hardware and ``main_grad`` contents (fixed chunk order, fixed vocabulary blocks,
    fixed-order partial sums, no atomics).

    Raises:
        ValueError: bad shape, dtype, device, stride, option, plan, workspace or mode, or a
            label outside ``[0, V)`` other than ``ignore_index`` where ``plan.check_labels``
            (the rule's CPU plans; on CUDA the rule skips that host sync, and such a label
            makes its row's loss and gradients NaN), before any launch; inputs are not
            modified.
    """
    return loss_call(DET, hidden, weight, labels, bias, ignore_index, reduction,
                     label_smoothing, z_loss, logit_softcap, return_lse, plan, workspace,
                     main_grad)


def check_return_lse(return_lse) -> None:
    """``return_lse`` must be a bool (a truthy string is a mistake, not a yes)."""
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse: expected a bool, got {return_lse!r}")


def loss_call(m: ModeClasses, hidden, weight, labels, bias, ignore_index, reduction,
              label_smoothing, z_loss, logit_softcap, return_lse, plan, workspace, main_grad):
    """:func:`lm_head_loss_det`'s body for the mode classes ``m`` (also a nondet
    sibling's autograd entry)."""
    check_return_lse(return_lse)
    device, cfg, plan, bufs = _prepare(hidden, weight, labels, bias, ignore_index, reduction,
                                       label_smoothing, z_loss, logit_softcap, plan, workspace,
                                       main_grad, m)
    H = hidden.shape[-1]
    lead = tuple(labels.shape)
    h2 = hidden.reshape(-1, H)
    l1 = labels.reshape(-1).contiguous()  # the kernels read labels with unit stride
    ge = torch.is_grad_enabled()
    needs = (ge and hidden.requires_grad,
             ge and (weight.requires_grad or main_grad is not None),
             ge and bias is not None and bias.requires_grad)
    if not torch.compiler.is_compiling():
        if plan.check_labels:
            _check_labels(l1, weight.shape[0], cfg[0])
        fn = m.function or _LMHeadLossDetFunction
        loss, lse = fn.apply(h2, weight, bias, l1, cfg, plan, bufs, main_grad, needs, m)
    else:
        loss, lse, *_ = getattr(torch.ops, m.op_namespace).fwd(
            h2, weight, bias, l1, *cfg, plan_to_op_fields(plan), *bufs, main_grad,
            bool(plan.check_labels), *needs)
    if cfg[1] == _NONE:
        loss = loss.reshape(lead)
    return (loss, lse.reshape(lead)) if return_lse else loss


def lm_head_loss_det_fwd(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, logit_softcap: float | None = None,
                         plan: LMHeadLossDetPlan | None = None,
                         workspace: LMHeadLossDetWorkspace | None = None):
    """Low-level forward without autograd: returns ``((loss, lse), saved)``.

    ``loss`` and ``lse`` as :func:`lm_head_loss_det` with ``return_lse=True``; ``saved`` an
    :class:`LMHeadLossDetSavedSet` for :func:`lm_head_loss_det_bwd`. With
    ``plan.grad_in_forward`` (reduction "mean"/"sum") the gradients of every input
    (dhidden, dweight, and dbias with a bias) are computed here and kept in ``saved``.
    Arguments, shapes and errors as in :func:`lm_head_loss_det`.
    """
    return fwd_call(DET, hidden, weight, labels, bias, ignore_index, reduction,
                    label_smoothing, z_loss, logit_softcap, plan, workspace)


def fwd_call(m: ModeClasses, hidden, weight, labels, bias, ignore_index, reduction,
             label_smoothing, z_loss, logit_softcap, plan, workspace):
    """:func:`lm_head_loss_det_fwd`'s body for the mode classes ``m``."""
    device, cfg, plan, bufs = _prepare(hidden, weight, labels, bias, ignore_index, reduction,
                                       label_smoothing, z_loss, logit_softcap, plan, workspace,
                                       None, m)
    H = hidden.shape[-1]
    h2 = hidden.reshape(-1, H)
    l1 = labels.reshape(-1).contiguous()  # the kernels read labels with unit stride
    if plan.check_labels:
        _check_labels(l1, weight.shape[0], cfg[0])
    with torch.no_grad():
        loss, lse, n_valid, dh, dw32, db32 = _forward_impl(h2, weight, bias, l1, cfg, plan,
                                                           bufs, True, True, True)
    gif = bool(plan.grad_in_forward) and cfg[1] != _NONE
    lead = tuple(labels.shape)
    saved = m.saved(
        m.mode,
        {"hidden": h2, "weight": weight, "bias": bias, "labels": l1, "lse": lse,
         "n_valid": n_valid, "dhidden": dh if gif else None,
         "dweight32": dw32 if gif and dw32.dtype == torch.float32 else None,
         "dlogits": dw32 if gif and dw32.dtype != torch.float32 else None,
         "dbias32": db32 if gif and bias is not None else None},
        meta={"plan": plan, "reduction": reduction, "ignore_index": cfg[0],
              "label_smoothing": cfg[2], "z_loss": cfg[3], "logit_softcap": cfg[4],
              "grad_in_forward": gif, "lead_shape": lead, "hidden_shape": tuple(hidden.shape)})
    if cfg[1] == _NONE:
        loss = loss.reshape(lead)
    return (loss, lse.reshape(lead)), saved


def lm_head_loss_det_bwd(dloss: torch.Tensor, saved: LMHeadLossDetSavedSet, *,
                         plan: LMHeadLossDetPlan | None = None,
                         workspace: LMHeadLossDetWorkspace | None = None,
                         main_grad: torch.Tensor | None = None) -> LMHeadLossDetGrads:
    """Low-level backward: the gradients for the upstream gradient ``dloss`` of the loss.

    Args:
        dloss: fp32; ``[]`` for "mean"/"sum", labels' shape for "none".
        saved: the :class:`LMHeadLossDetSavedSet` of :func:`lm_head_loss_det_fwd`.
        plan: default: the forward's. A saved set holding forward-computed gradients
            accepts only the forward's plan; otherwise any plan for (H, V).
        workspace, main_grad: as in :func:`lm_head_loss_det`.

    Returns:
        :class:`LMHeadLossDetGrads` ``(dhidden, dweight, dbias)``: dhidden of hidden's
        shape and dtype, dweight of weight's dtype (``None`` with ``main_grad``), dbias of
        bias's dtype (``None`` without a bias).

    Raises:
        ValueError: a saved set, plan or workspace of another type or mode, a plan other
            than the forward's for forward-computed gradients, ``dloss`` or ``main_grad``
            of the wrong shape or dtype, devices that differ; before any launch.
    """
    return bwd_call(DET, dloss, saved, plan, workspace, main_grad)


def bwd_call(m: ModeClasses, dloss, saved, plan, workspace, main_grad):
    """:func:`lm_head_loss_det_bwd`'s body for the mode classes ``m`` (``m.alert`` runs
    after the checks, before any launch)."""
    require_mode(saved, m.saved, m.mode, name="saved")
    h2, weight, bias, l1, lse, n_valid, dh_s, dw32_s, dl_s, db32_s = saved.tensors()
    dw32_s = dl_s if dl_s is not None else dw32_s
    T, H = h2.shape
    V = weight.shape[0]
    check_tensor(dloss, "dloss")
    check_dtype(dloss, "dloss", (torch.float32,))
    check_shape(dloss, "dloss", list(saved.lead_shape) if saved.reduction == "none" else [])
    _check_main_grad(main_grad, V, H)
    device = check_same_device(("saved", h2), ("dloss", dloss), ("main_grad", main_grad))
    launch_device_check(device, "dloss")
    if saved.grad_in_forward and plan is not None and plan != saved.plan:
        raise ValueError("plan: the forward computed the gradients with its own plan "
                         f"({saved.plan.key}); pass that plan or none")
    # "mean": grad_in_forward concerns the forward only; the backward accepts any plan flag
    plan = _resolve_plan(plan if plan is not None else saved.plan, H, V, h2.dtype, device,
                         "mean", m)
    bufs = _resolve_workspace(workspace, plan, device, h2.dtype, m)
    if m.alert is not None:
        m.alert()
    cfg = (saved.ignore_index, _RED[saved.reduction], saved.label_smoothing, saved.z_loss,
           saved.logit_softcap)
    with torch.no_grad():
        dh, dw, db = _backward_impl(dloss, h2, weight, bias, l1, lse, n_valid, dh_s, dw32_s,
                                    db32_s, cfg, plan, bufs, main_grad, True, True, True,
                                    bool(saved.grad_in_forward))
    return m.grads(dh.reshape(saved.hidden_shape),
                              dw if main_grad is None else None,
                              db if bias is not None else None)
