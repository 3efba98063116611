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


def moe_feed_forward_reference(x: torch.Tensor, router_weight: torch.Tensor,
                               w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int, *,
                               normalize_topk: bool = True, aux_loss_coef: float = 0.01,
                               dtype: torch.dtype = torch.float64
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE feed-forward as a loop over tokens and their experts, in ``dtype`` (float64
    by default): the spec :func:`cake_moe_grouped_det_gemm.moe_feed_forward_det` meets.

    For each token t: ``p = softmax(x[t] · Rᵀ)``; its k experts are the ones of highest p,
    ties to the lower index (``sorted`` by ``(-p[e], e)``); ``w = p[ids]`` (``/ w.sum()``
    with ``normalize_topk``); ``y[t] = Σ_j w[j] · W_d[e_j] (silu(g) * u)`` with
    ``[g; u] = W_gu[e_j] x[t]`` (gate rows first). ``aux = aux_loss_coef · E · Σ_e f_e P_e``
    with f_e the fraction of the T·k assignments on e and P_e the mean of p over tokens.

    Shapes as the det layer (x ``[..., d]``, router_weight ``[E, d]``, w_gate_up
    ``[E, 2f, d]``, w_down ``[E, d, f]``). Returns ``(y, aux)`` in ``dtype``, y shaped
    like x; differentiable by autograd in every input. Slow (a test reference).
    """
    d = router_weight.shape[1]
    E, f = w_down.shape[0], w_down.shape[2]
    xs = x.reshape(-1, d).to(dtype)
    R, Wgu, Wd = router_weight.to(dtype), w_gate_up.to(dtype), w_down.to(dtype)
    T = xs.shape[0]
    probs = torch.softmax(xs @ R.t(), dim=-1)
    counts = [0] * E
    ys = []
    for t in range(T):
        p = probs[t]
        vals = p.tolist()
        ids = sorted(range(E), key=lambda e: (-vals[e], e))[:top_k]
        w = p[ids]
        if normalize_topk:
            w = w / w.sum()
        acc = xs.new_zeros(d)
        for j, e in enumerate(ids):
            h = Wgu[e] @ xs[t]
            acc = acc + w[j] * (Wd[e] @ (torch.nn.functional.silu(h[:f]) * h[f:]))
            counts[e] += 1
        ys.append(acc)
    y = torch.stack(ys) if ys else xs.new_zeros((0, d))
    frac = torch.tensor(counts, dtype=dtype, device=xs.device) / max(T * top_k, 1)
    aux = aux_loss_coef * E * (frac * probs.sum(0) / max(T, 1)).sum()
    return y.reshape(x.shape), aux
