"""nn.Module drop-ins."""

from __future__ import annotations

from cake_causal_conv1d_det_train.modules import ShortConvolution

from cake_causal_conv1d_nondet_train.api import causal_conv1d_nondet


class ShortConvolutionNondet(ShortConvolution):
    """FLA's ``ShortConvolution`` (a depthwise causal ``nn.Conv1d``) on this package's
    entry, :func:`~cake_causal_conv1d_nondet_train.causal_conv1d_nondet` (bits not
    promised repeatable).

    Constructor, parameters, ``state_dict``, ``forward(x, residual=None, mask=None,
    cache=None, output_final_state=False, cu_seqlens=None, chunk_indices=None, *,
    initial_state=None) -> (y, final_state)`` and errors are those of
    ``cake_causal_conv1d_det_train.ShortConvolution`` (states ``[N, D, W - 1]``).
    """

    _conv = staticmethod(causal_conv1d_nondet)
