"""The LM-head loss in plain torch: the spec the kernels meet (float64-capable).

Materializes the whole ``[T, V]`` logits: for tests and small shapes only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_head_loss_reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                           bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                           reduction: str = "mean", label_smoothing: float = 0.0,
                           z_loss: float = 0.0, logit_softcap: float | None = None,
                           return_lse: bool = False, dtype: torch.dtype | None = None):
    """``F.cross_entropy(logits, labels, ignore_index, reduction, label_smoothing)`` of
    ``logits = hidden @ weight.T (+ bias)``, soft-capped to ``c * tanh(logits / c)`` with
    ``logit_softcap`` = c (Gemma 2), plus ``z_loss * logsumexp(logits)**2`` per non-ignored
    token (PaLM). "mean" divides by the count of non-ignored tokens, and gives 0 (not NaN)
    when there is none.

    Computes in ``dtype`` (default: float32, as ``logits.float()``; pass ``torch.float64``
    for the reference). Differentiable by autograd. Returns ``loss`` or ``(loss, lse)``.
    """
    dtype = dtype or torch.float32
    H = hidden.shape[-1]
    lead = labels.shape
    h = hidden.reshape(-1, H).to(dtype)
    z = h @ weight.to(dtype).T
    if bias is not None:
        z = z + bias.to(dtype)
    if logit_softcap is not None:
        z = logit_softcap * torch.tanh(z / logit_softcap)
    y = labels.reshape(-1)
    valid = y != ignore_index
    lse = torch.logsumexp(z, dim=-1) if z.shape[0] else z.new_zeros((0,))
    if z.shape[0]:
        per = F.cross_entropy(z, y, ignore_index=ignore_index, reduction="none",
                              label_smoothing=label_smoothing)
    else:
        per = z.new_zeros((0,))
    per = per + z_loss * torch.where(valid, lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        loss = per.reshape(lead)
    elif reduction == "sum":
        loss = per.sum()
    else:
        loss = per.sum() / valid.sum().clamp_min(1).to(dtype)
    return (loss, lse.reshape(lead)) if return_lse else loss
