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
from cake_core.linear_attention import L2NORM_EPS as L2NORM_EPS  # the q/k L2 norm's eps
from cake_core.linear_attention import delta_rule_reference

#: softplus(x) = x for x above this (FLA's and torch's threshold).
SOFTPLUS_THRESHOLD = 20.0


def gdn_gate_reference(g: torch.Tensor, A_log: torch.Tensor,
                       dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """FLA's in-kernel gate: ``-exp(A_log[h]) * softplus(g + dt_bias[h])`` over the last
    (value head) dim, in g's dtype (differentiable)."""
    x = g + dt_bias.to(g.dtype) if dt_bias is not None else g
    return -torch.exp(A_log.to(g.dtype)) * F.softplus(x, threshold=SOFTPLUS_THRESHOLD)


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
    gate = None
    if use_gate_in_kernel:
        def gate(g):
            return gdn_gate_reference(g, A_log.to(dtype),
                                      dt_bias.to(dtype) if dt_bias is not None else None)
    return delta_rule_reference(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, dtype=dtype,
        gate=gate, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
