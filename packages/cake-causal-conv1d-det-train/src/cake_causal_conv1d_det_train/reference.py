"""Causal depthwise conv1d in plain torch: the spec the kernels meet (float64-capable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_reference(x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None, *, activation: str | None = None,
                            cu_seqlens: torch.Tensor | None = None,
                            initial_state: torch.Tensor | None = None,
                            output_final_state: bool = False,
                            dtype: torch.dtype | None = None):
    """Per sequence: left-pad with the initial state (or W - 1 zeros), ``F.conv1d`` with
    ``groups=D``, then SiLU when ``activation`` is ``"silu"``/``"swish"``.

    Shapes as :func:`cake_causal_conv1d_det_train.causal_conv1d_det` (x ``[B, T, D]``, or
    ``[1, T, D]`` with ``cu_seqlens`` ``[N + 1]``; weight ``[D, W]``; initial state
    ``[N, D, W - 1]``). Computes in ``dtype`` (default: x's; pass ``torch.float64`` for the
    reference). Returns ``(y, final_state)``; ``final_state`` ``[N, D, W - 1]`` (the last
    W - 1 inputs of each padded sequence) or ``None`` without ``output_final_state``.
    Differentiable by autograd (slow: a Python loop over the sequences).
    """
    dtype = dtype or x.dtype
    B, T, D = x.shape
    W = weight.shape[1]
    w = weight.to(dtype).reshape(D, 1, W)
    b = bias.to(dtype) if bias is not None else None
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        seqs = [x[0, bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
    else:
        seqs = [x[i] for i in range(B)]
    ys, finals = [], []
    for n, xs in enumerate(seqs):
        if initial_state is not None:
            head = initial_state[n].to(dtype).t()
        else:
            head = torch.zeros(W - 1, D, dtype=dtype, device=x.device)
        padded = torch.cat([head, xs.to(dtype)], 0)  # [L + W - 1, D]
        if xs.shape[0]:
            y = F.conv1d(padded.t().unsqueeze(0), w, b, groups=D)[0].t()
        else:
            y = padded[:0]
        if activation in ("silu", "swish"):
            y = F.silu(y)
        ys.append(y)
        finals.append(padded[padded.shape[0] - (W - 1):].t())
    if cu_seqlens is not None:
        y = torch.cat(ys, 0).unsqueeze(0)
    else:
        y = torch.stack(ys, 0) if ys else x.new_empty((0, T, D), dtype=dtype)
    final = None
    if output_final_state:
        final = torch.stack(finals, 0) if finals else x.new_empty((0, D, W - 1), dtype=dtype)
    return y, final
