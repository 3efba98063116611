"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of the det LM-head loss (``cake_core.support``)."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_lm_head_loss_det_train.api import (
    _NONE,
    DET,
    ModeClasses,
    _check_labels,
    _prepare,
    check_return_lse,
)
from cake_lm_head_loss_det_train.plan import LMHeadLossDetPlan
from cake_lm_head_loss_det_train.saved import LMHeadLossDetWorkspace, workspace_buffers


def is_supported(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                 bias: torch.Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0, logit_softcap: float | None = None,
                 return_lse: bool = False, plan: LMHeadLossDetPlan | None = None,
                 workspace: LMHeadLossDetWorkspace | None = None,
                 main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_lm_head_loss_det_train.lm_head_loss_det` serves this call, with
    its own arguments: ``Support(True, "")``, or ``Support(False, reason)`` with the message
    of the ``ValueError`` the entry would raise. Runs the entry's checks only (no kernel
    launch, no output allocated); never raises ``ValueError``. Label values are read only
    when labels live on the CPU (as the entry does with ``plan.check_labels``); on a GPU
    they are not read (that would sync), so an out-of-range label there is the entry's
    error only.

    Example::

        is_supported(torch.randn(4, 16), torch.randn(32, 16), torch.tensor([1, 2, 3, 4])).ok
    """
    return _is_supported(DET, hidden, weight, labels, bias, ignore_index, reduction,
                         label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad,
                         return_lse=return_lse)


def _is_supported(m: ModeClasses, hidden, weight, labels, bias, ignore_index, reduction,
                  label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad, *,
                  return_lse=False):
    """:func:`is_supported` for the mode classes ``m`` (also the nondet sibling's)."""
    def check():
        check_return_lse(return_lse)
        _, cfg, p, _ = _prepare(hidden, weight, labels, bias, ignore_index, reduction,
                                label_smoothing, z_loss, logit_softcap, plan, workspace,
                                main_grad, m)
        if p.check_labels and labels.device.type == "cpu":
            _check_labels(labels.reshape(-1), weight.shape[0], cfg[0])

    return support_of(check)


def workspace_bytes(plan: LMHeadLossDetPlan, device: torch.device | str | None = None,
                    dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes ``LMHeadLossDetWorkspace.for_plan(plan, device, dtype)`` allocates (fp32
    logits ``[chunk_tokens, V]``, ``dlogits`` in ``dtype`` unless fp32, the dhidden
    partials when ``plan.dh_split > 1``), computed without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a det
            :class:`LMHeadLossDetPlan`, ``dtype`` not fp32 / bf16 / fp16.

    Example::

        workspace_bytes(make_plan(4096, 128256, torch.bfloat16, "cpu"))
    """
    return _workspace_bytes(LMHeadLossDetPlan, plan, device, dtype)


def _workspace_bytes(plan_cls: type, plan, device, dtype) -> int:
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan, dtype, plan_cls=plan_cls).values())


def saved_bytes(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                bias: torch.Tensor | None = None, ignore_index: int = -100,
                reduction: str = "mean", label_smoothing: float = 0.0,
                z_loss: float = 0.0, logit_softcap: float | None = None,
                return_lse: bool = False, plan: LMHeadLossDetPlan | None = None,
                workspace: LMHeadLossDetWorkspace | None = None,
                main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_lm_head_loss_det_train.lm_head_loss_det`
    allocates and keeps for the backward, with the entry's own arguments, when every input
    needs its gradient (the saved set of ``lm_head_loss_det_fwd``; the autograd entry
    keeps less for an input without one): fp32 ``lse`` ``[T]`` and the int64 count of
    valid tokens; with ``plan.grad_in_forward`` ("mean"/"sum") the forward's gradients:
    dhidden ``[T, H]`` in hidden's dtype, dweight as fp32 ``[V, H]`` (or, 16-bit inputs
    with ``T <= plan.defer_dw_tokens``, the dlogits ``[T, V]`` in hidden's dtype), fp32
    dbias ``[V]`` with a bias; plus the flattened copies of hidden and labels when they
    cannot be flattened as views. Computed from shapes, strides and the plan; label values
    are not read; tensors on the meta device are served (the backend's device check is
    skipped, the others are run).

    Raises:
        ValueError: the entry's, for bad arguments (label values aside).

    Example::

        saved_bytes(torch.empty(4, 16, device="meta"), torch.empty(32, 16, device="meta"),
                    torch.empty(4, dtype=torch.int64, device="meta"))
    """
    return _saved_bytes(DET, hidden, weight, labels, bias, ignore_index, reduction,
                        label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad)


def _copies(t: torch.Tensor, shape: tuple[int, ...], contiguous: bool) -> bool:
    """Whether the forward's ``t.reshape(shape)`` (then ``.contiguous()`` when
    ``contiguous``) is a new tensor."""
    try:
        v = t.view(shape)
    except RuntimeError:
        return True
    return contiguous and not v.is_contiguous()


def _saved_bytes(m: ModeClasses, hidden, weight, labels, bias, ignore_index, reduction,
                 label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad) -> int:
    """:func:`saved_bytes` for the mode classes ``m`` (also the nondet sibling's)."""
    _, cfg, plan, _ = _prepare(hidden, weight, labels, bias, ignore_index, reduction,
                               label_smoothing, z_loss, logit_softcap, plan, workspace,
                               main_grad, m, launch=False)
    H, V, dt = hidden.shape[-1], weight.shape[0], hidden.dtype
    T = labels.numel()
    kept = [((T,), torch.float32), ((), torch.int64)]
    if _copies(hidden, (T, H), False):
        kept.append(((T, H), dt))
    if _copies(labels, (T,), True):
        kept.append(((T,), torch.int64))
    if plan.grad_in_forward and cfg[1] != _NONE:
        kept.append(((T, H), dt))
        if dt != torch.float32 and 0 < T <= plan.defer_dw_tokens:
            kept.append(((T, V), dt))
        else:
            kept.append(((V, H), torch.float32))
        if bias is not None:
            kept.append(((V,), torch.float32))
    return nbytes_of(kept)


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
