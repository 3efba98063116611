"""Gated DeltaNet in plain torch, token by token: the spec the kernels meet (float64-capable).

Semantics of FLA's ``chunk_gated_delta_rule`` (Yang, Kautz & Hatamizadeh, 2024, "Gated Delta
Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464), per sequence and value head,
with state ``S`` of shape ``[K, V]``::

    S   <- exp(g_t) * S
    u_t  = beta_t * (v_t - S^T k_t)
    S   <- S + k_t u_t^T
    o_t  = scale * S^T q_t
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: eps of the optional q/k L2 normalisation: x * rsqrt(sum(x**2) + eps), as in FLA. The
#: kernels use cake_core.l2norm.L2NORM_EPS, the same value (tested); written out here so the
#: reference stays plain torch (cake_core.l2norm imports Triton).
L2NORM_EPS = 1e-6
#: softplus(x) = x for x above this (FLA's and torch's threshold).
SOFTPLUS_THRESHOLD = 20.0


def gdn_gate_reference(g: torch.Tensor, A_log: torch.Tensor,
                       dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """FLA's in-kernel gate: ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` over the last
    (value head) dim, in g's dtype (differentiable)."""
    x = g + dt_bias.to(g.dtype) if dt_bias is not None else g
    return -torch.exp(A_log.to(g.dtype)) * F.softplus(x, threshold=SOFTPLUS_THRESHOLD)


def l2norm_reference(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x * rsqrt(sum(x**2, -1) + eps)`` in x's dtype (differentiable)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gdn_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, scale: float | None = None,
                  initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                  use_qk_l2norm_in_kernel: bool = False,
                  cu_seqlens: torch.Tensor | None = None, *,
                  dtype: torch.dtype | None = None, use_gate_in_kernel: bool = False,
                  A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                  use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False):
    """The gated delta rule, one token at a time (slow; for tests and as the spec).

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, HV a multiple of H; value head ``j``
            reads q/k head ``j // (HV // H)``.
        g: ``[B, T, HV]``, log-space decay (the state is multiplied by ``exp(g_t)``).
        beta: ``[B, T, HV]``.
        scale: output scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or ``None`` (zeros), N sequences.
        output_final_state: also return the state after each sequence's last token.
        use_qk_l2norm_in_kernel: L2-normalise q and k per head first (eps 1e-6).
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (then B == 1), or ``None``
            (N = B sequences of T tokens).
        dtype: compute dtype (default q's dtype; pass ``torch.float64`` for the reference).
        use_gate_in_kernel, A_log, dt_bias: as in FLA: g is the raw gate and the log-decay
            is ``-exp(A_log) * softplus(g + dt_bias)`` (:func:`gdn_gate_reference`).
        use_beta_sigmoid_in_kernel: beta is pre-sigmoid; ``sigmoid(beta)`` is used
            (``2 * sigmoid(beta)`` with ``allow_neg_eigval``, as in FLA).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` and the ``[N, HV, K, V]`` final states (or
        ``None`` without ``output_final_state``), both in ``dtype``. Differentiable by autograd.
    """
    dtype = dtype or q.dtype
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if use_gate_in_kernel:
        g = gdn_gate_reference(g, A_log.to(dtype),
                               dt_bias.to(dtype) if dt_bias is not None else None)
    if use_beta_sigmoid_in_kernel:
        beta = (2.0 if allow_neg_eigval else 1.0) * torch.sigmoid(beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_reference(q), l2norm_reference(k)
    # value head j uses q/k head j // group
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens.tolist()]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    outs = []
    finals = []
    for n, (b, bos, eos) in enumerate(spans):
        if initial_state is not None:
            S = initial_state[n].to(dtype)
        else:
            S = torch.zeros(HV, K, V, dtype=dtype, device=q.device)
        seq_out = []
        for t in range(bos, eos):
            kt, vt, qt = k[b, t], v[b, t], q[b, t]          # [HV, K], [HV, V], [HV, K]
            S = S * torch.exp(g[b, t])[:, None, None]
            kS = torch.einsum("hk,hkv->hv", kt, S)
            u = beta[b, t][:, None] * (vt - kS)
            S = S + kt[:, :, None] * u[:, None, :]
            seq_out.append(scale * torch.einsum("hk,hkv->hv", qt, S))
        outs.append(torch.stack(seq_out) if seq_out else v.new_zeros((0, HV, V)))
        finals.append(S)
    if cu_seqlens is None:
        o = torch.stack(outs) if outs else v.new_zeros((B, T, HV, V))
    else:
        o = torch.cat(outs).unsqueeze(0)
    final = None
    if output_final_state:
        final = torch.stack(finals) if finals else v.new_zeros((0, HV, K, V))
    return o, final
