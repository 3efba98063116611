"""Host-side steps the entry points of cake-gqa-det-train and cake-gqa-train share: plan
resolution, the packed view of batched input, the forward outside autograd, dout checks
and flash-attn's option handling. Each takes what differs between the two packages (plan
class, mode, saved-set class, the entry's name) as arguments."""

from __future__ import annotations

import torch
from cake_core import Mode, check_dtype, check_shape, check_tensor, require_mode
from cake_core.support import nbytes_of

from cake_gqa_det_train.inputs import Problem, resolve_op_ints
from cake_gqa_det_train.launch import launch_fwd


def resolve_plan(plan, cls: type, mode: Mode, D: int, dtype: torch.dtype, device, make):
    """``make(D, dtype, device)`` when ``plan`` is None; else ``plan`` once it is a ``cls``
    of ``mode`` for head dim ``D`` and ``dtype``'s element size (``ValueError`` if not)."""
    if plan is None:
        return make(D, dtype, device)
    require_mode(plan, cls, mode, name="plan")
    if plan.head_dim != D:
        raise ValueError(f"plan: made for head_dim={plan.head_dim}, inputs have {D}")
    if plan.elem_bytes != dtype.itemsize:
        raise ValueError(f"plan: made for {plan.elem_bytes}-byte inputs, q is "
                         f"{str(dtype)[6:]}; make_plan(D, q.dtype, device)")
    return plan


def distinct(q, k, v):
    """The same tensor passed as two of q, k, v crosses the autograd Function as a view
    (``torch.compile`` refuses a duplicate input there)."""
    if k is q:
        k = k.view_as(k)
    if v is q or v is k:
        v = v.view_as(v)
    return q, k, v


def lastc(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def packed(q, k, v):
    """``[T, H, D]`` views (copies only where the batch and token strides do not merge)."""
    if q.dim() == 4:
        return (q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                v.reshape(-1, *v.shape[2:]))
    return q, k, v


def _packs_as_view(t: torch.Tensor) -> bool:
    """Whether :func:`packed` views ``t`` (its batch and token strides merge) or copies it."""
    try:
        t.view(-1, *t.shape[2:])
    except RuntimeError:
        return False
    return True


def saved_nbytes(q, k, v, prob: Problem) -> int:
    """The bytes a forward allocates that its saved set keeps, from shapes and dtypes
    alone (meta tensors work): out ``[Tq, Hq, D]`` in q's dtype, lse ``[Hq, Tq]`` fp32, and
    the packed copy of a 4-D q, k or v whose batch and token strides do not merge (a view
    of the caller's tensor costs nothing)."""
    shapes = [((prob.n_tok_q, prob.heads_q, prob.head_dim), q.dtype),
              ((prob.heads_q, prob.n_tok_q), torch.float32)]
    if q.dim() == 4:
        shapes += [(t.shape, t.dtype) for t in (q, k, v) if not _packs_as_view(t)]
    return nbytes_of(shapes)


def unpacked(out, lse, q_shape, prob: Problem):
    """out and lse in the caller's layout: as computed when packed, else ``[B, Sq, Hq, D]``
    and ``[B, Hq, Sq]``."""
    if prob.varlen:
        return out, lse
    B, Sq = q_shape[0], q_shape[1]
    return out.reshape(q_shape), lse.reshape(prob.heads_q, B, Sq).permute(1, 0, 2)


def forward_saved(q, k, v, cu_q, cu_k, prob: Problem, plan, saved_cls: type, mode: Mode):
    """The forward outside autograd: ``(out, lse, saved)`` in the caller's layout, the
    saved set a ``saved_cls`` of ``mode``."""
    if prob.varlen and cu_k is None:
        cu_k = cu_q
    q3, k3, v3 = packed(q.detach(), k.detach(), v.detach())
    ints = resolve_op_ints(prob.op_ints(), q3, k3, cu_q, cu_k)
    out, lse = launch_fwd(q3, k3, v3, cu_q, cu_k, ints, prob.scale, prob.softcap,
                          plan.fwd_block_m, plan.fwd_block_n, plan.fwd_warps,
                          plan.fwd_stages)
    saved = saved_cls(
        mode, {"q": q3, "k": k3, "v": v3, "out": out, "lse": lse,
               "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
        meta={"plan": plan, "ints": ints, "scale": prob.scale, "softcap": prob.softcap,
              "problem": prob, "shapes": (tuple(q.shape), tuple(k.shape), tuple(v.shape))})
    o, lse_out = unpacked(out, lse, tuple(q.shape), prob)
    return o, lse_out, saved


def checked_dout(dout, saved) -> torch.Tensor:
    """``dout`` as the packed ``[Tq, Hq, D]`` the kernels take, after the checks of shape
    (the forward's q), dtype and device (``ValueError``)."""
    q_shape = saved.meta["shapes"][0]
    check_tensor(dout, "dout")
    check_shape(dout, "dout", list(q_shape))
    check_dtype(dout, "dout", (saved.q.dtype,))
    if dout.device != saved.q.device:
        raise ValueError(f"dout: on {dout.device}, the forward ran on {saved.q.device}")
    return lastc(dout.reshape(saved.out.shape))


def fa_flag(v, name: str) -> bool:
    """flash-attn's flags as it takes them (Python truthiness of a bool, 0 / 1 or a numpy
    bool); anything else is refused."""
    numpy_bool = type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_")
    if isinstance(v, bool) or numpy_bool or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise ValueError(f"{name}: expected a bool, got {v!r}")


def refuse_fa_options(dropout_p, alibi_slopes, return_attn_probs, lse_entry: str) -> None:
    """flash-attn options the training kernels do not serve (``ValueError``);
    ``lse_entry`` names the entry that returns the log-sum-exp instead."""
    if dropout_p != 0:
        raise ValueError(f"dropout_p: attention dropout is not served, got {dropout_p!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ALiBi is not served")
    if return_attn_probs is not False:
        raise ValueError("return_attn_probs: attention probabilities are not returned "
                         f"(use {lse_entry}(..., return_lse=True) for the log-sum-exp)")


def check_fa_batched(q) -> None:
    if not (isinstance(q, torch.Tensor) and q.dim() == 4):
        raise ValueError("q: flash_attn_func takes [B, S, H, D]; packed input goes to "
                         "flash_attn_varlen_func")


def check_fa_varlen(q, cu_seqlens_k, block_table) -> None:
    if block_table is not None:
        raise ValueError("block_table: paged KV caches are not served (training kernels)")
    if not (isinstance(q, torch.Tensor) and q.dim() == 3):
        raise ValueError("q: flash_attn_varlen_func takes packed [T, H, D]")
    if cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k: required by flash_attn_varlen_func")
