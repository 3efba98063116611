"""The math of cake-gqa-det-train in plain torch (float64-capable): the spec the kernels
meet, and what the tests compare against.

Per document and query head h (KV head ``h // (Hq / Hkv)``), with Lq queries and Lk keys,
query i sees key j when ``j <= i + (Lk - Lq) + right`` (``right`` = 0 under ``causal``;
flash-attn 2's bottom-right alignment) and ``j >= i + (Lk - Lq) - left`` (each bound only
when set, -1 = unbounded)::

    s = scale * q_i . k_j                      (softcap > 0: s = softcap * tanh(s / softcap))
    lse_i = log sum_{j visible} exp(s_ij)      (natural log; -inf when no key is visible)
    o_i = sum_{j visible} exp(s_ij - lse_i) v_j   (0 when no key is visible)
"""

from __future__ import annotations

import torch


def visible_mask(len_q: int, len_k: int, causal: bool, window_size: tuple[int, int],
                 device=None) -> torch.Tensor:
    """``[len_q, len_k]`` bool: which keys each query sees."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(len_q, device=device)[:, None]
    j = torch.arange(len_k, device=device)[None, :]
    shift = len_k - len_q
    ok = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= i + shift + right
    if left >= 0:
        ok &= j >= i + shift - left
    return ok


def gqa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cu_seqlens_q: torch.Tensor | None = None,
                  cu_seqlens_k: torch.Tensor | None = None, *,
                  softmax_scale: float | None = None, causal: bool = True,
                  window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in the inputs' dtype (out) and fp32-or-wider (lse), differentiable.

    Shapes as :func:`~cake_gqa_det_train.gqa_det`: q ``[B, Sq, Hq, D]`` with k, v
    ``[B, Sk, Hkv, D]`` (lse ``[B, Hq, Sq]``), or packed q ``[Tq, Hq, D]``, k, v
    ``[Tk, Hkv, D]`` with ``cu_seqlens_q`` / ``cu_seqlens_k`` (lse ``[Hq, Tq]``).
    """
    D = q.shape[-1]
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    if q.dim() == 4:
        outs, lses = [], []
        for b in range(q.shape[0]):
            o, lse = _one(q[b], k[b], v[b], scale, causal, window_size, softcap)
            outs.append(o)
            lses.append(lse)
        return torch.stack(outs), torch.stack(lses)
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    outs, lses = [], []
    for n in range(len(cq) - 1):
        o, lse = _one(q[cq[n]:cq[n + 1]], k[ck[n]:ck[n + 1]], v[ck[n]:ck[n + 1]], scale,
                      causal, window_size, softcap)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _one(q, k, v, scale, causal, window_size, softcap):
    """One document: q ``[Lq, Hq, D]``, k, v ``[Lk, Hkv, D]`` -> (o, lse ``[Hq, Lq]``)."""
    Lq, Hq, _ = q.shape
    Lk, Hkv, _ = k.shape
    g = Hq // Hkv
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    ok = visible_mask(Lq, Lk, causal, window_size, q.device)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)  # -inf where no key is visible
    seen = ok.any(-1)  # [Lq]
    p = torch.exp(s - torch.where(seen, lse, torch.zeros_like(lse))[..., None])
    p = torch.where(ok, p, torch.zeros_like(p))
    o = torch.einsum("hij,jhd->ihd", p, vv)
    lse_dtype = torch.promote_types(q.dtype, torch.float32)
    return o, lse.to(lse_dtype)
