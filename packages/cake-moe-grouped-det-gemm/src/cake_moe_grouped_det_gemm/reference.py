"""The MoE grouped GEMM in plain torch: the spec the kernels meet (float64-capable)."""

from __future__ import annotations

import torch


def moe_grouped_gemm_reference(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, *,
                               dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y[rows of e] = x[rows of e] · weight[e]ᵀ``, rows of e = ``[offs[e-1], offs[e])``
    (``offs[-1]`` read as 0), rows past ``offs[E-1]`` zero. x ``[M, K]``, weight
    ``[E, N, K]``, offs ``[E]`` non-decreasing in ``[0, M]`` (read on the host: a test
    reference, not a kernel).

    Computes in ``dtype`` (default: x's dtype; pass ``torch.float64`` for the reference).
    Differentiable by autograd in x and weight.
    """
    dtype = dtype or x.dtype
    xs, ws = x.to(dtype), weight.to(dtype)
    ends = [int(v) for v in offs.tolist()]
    rows, start = [], 0
    for e, end in enumerate(ends):
        rows.append(xs[start:end] @ ws[e].t())
        start = end
    rows.append(xs.new_zeros((x.shape[0] - start, weight.shape[1])))
    return torch.cat(rows, 0)
