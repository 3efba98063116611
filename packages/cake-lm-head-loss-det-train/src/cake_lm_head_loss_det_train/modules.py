"""nn.Module drop-ins."""

from __future__ import annotations

import numbers

import torch
from torch import nn

from cake_lm_head_loss_det_train.api import check_options, lm_head_loss_det


class LMHeadLoss(nn.Module):
    """An LM head (``nn.Linear(hidden_size, vocab_size, bias)``) fused with its cross
    entropy, running cake's deterministic chunked kernels.

    Owns ``weight`` ``[V, H]`` (and ``bias`` ``[V]``) with ``nn.Linear``'s initialization
    and ``state_dict`` keys, so ``load_state_dict`` of an ``nn.Linear`` LM head works as
    is. A weight of another dtype than the input's is cast to it (differentiably; the
    gradient then reaches the weight through that cast). ``forward(hidden, labels)``
    returns the loss of
    :func:`cake_lm_head_loss_det_train.lm_head_loss_det` with the options given here; the
    logits are never materialized. Not twice differentiable.

    Raises:
        ValueError: (construction) sizes that are not ints >= 1, or loss options the
            entry refuses; (forward) as :func:`lm_head_loss_det`.
    """

    #: the entry forward calls (cake-lm-head-loss-nondet-train's subclass sets its own)
    _loss = staticmethod(lm_head_loss_det)

    def __init__(self, hidden_size: int, vocab_size: int, bias: bool = False, *,
                 ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, z_loss: float = 0.0,
                 logit_softcap: float | None = None, device=None, dtype=None):
        super().__init__()
        for n, v in (("hidden_size", hidden_size), ("vocab_size", vocab_size)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{n}: expected an int >= 1, got {v!r}")
        # the loss options fail here, not at the first forward
        check_options(ignore_index, reduction, label_smoothing, z_loss, logit_softcap)
        self.hidden_size = int(hidden_size)
        self.vocab_size = int(vocab_size)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.logit_softcap = logit_softcap
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.vocab_size, self.hidden_size, **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.vocab_size, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialization (torch's own code; reads only weight and bias)."""
        nn.Linear.reset_parameters(self)

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if isinstance(hidden, torch.Tensor) and hidden.is_floating_point():
            if w.dtype != hidden.dtype:  # e.g. fp32 master weights, bf16 activations
                w = w.to(hidden.dtype)
            if b is not None and b.dtype not in (hidden.dtype, torch.float32):
                b = b.to(hidden.dtype)
        return self._loss(hidden, w, labels, bias=b, ignore_index=self.ignore_index,
                          reduction=self.reduction, label_smoothing=self.label_smoothing,
                          z_loss=self.z_loss, logit_softcap=self.logit_softcap)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}, "
                f"bias={self.bias is not None}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"logit_softcap={self.logit_softcap}")
