"""nn.Module drop-ins."""

from __future__ import annotations

from cake_lm_head_loss_det_train.modules import LMHeadLoss

from cake_lm_head_loss_nondet_train.api import lm_head_loss_nondet


class LMHeadLossNondet(LMHeadLoss):
    """An LM head (``nn.Linear(hidden_size, vocab_size, bias)``) fused with its cross
    entropy, on this package's entry,
    :func:`~cake_lm_head_loss_nondet_train.lm_head_loss_nondet` (bits not promised
    repeatable).

    Constructor (``hidden_size, vocab_size, bias=False, *, ignore_index=-100,
    reduction="mean", label_smoothing=0.0, z_loss=0.0, logit_softcap=None, device=None,
    dtype=None``), parameters, ``state_dict``, ``forward(hidden, labels) -> loss`` and
    errors are those of ``cake_lm_head_loss_det_train.LMHeadLoss``.
    """

    _loss = staticmethod(lm_head_loss_nondet)
