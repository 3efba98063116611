"""Kimi Delta Attention in plain torch, token by token: the spec the kernels meet
(float64-capable, differentiable by autograd).

Semantics of FLA's ``chunk_kda`` (Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient
Attention Architecture", arXiv:2510.26692; FLA's ``fla/ops/kda``), per sequence and value
head, with a state ``S`` of shape ``[K, V]`` and a per-channel log decay ``g_t`` ``[K]``::

    S   <- diag(exp(g_t)) S
    u_t  = beta_t * (v_t - S^T k_t)
    S   <- S + k_t u_t^T
    o_t  = scale * S^T q_t

FLA's in-kernel options: the q/k L2 norm (``x * rsqrt(sum(x**2) + 1e-6)``), the gate from
the raw ``g`` (:func:`kda_gate_ref`) and the beta sigmoid (``sigmoid(beta)``, or
``2 * sigmoid(beta)`` with ``allow_neg_eigval``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cake_core.linear_attention import L2NORM_EPS as L2NORM_EPS  # the q/k L2 norm's eps
from cake_core.linear_attention import delta_rule_reference

#: softplus(x) = x for x above this (FLA's and torch's threshold).
SOFTPLUS_THRESHOLD = 20.0


def kda_gate_ref(g: torch.Tensor, A_log: torch.Tensor | None = None,
                 dt_bias: torch.Tensor | None = None,
                 lower_bound: float | None = None) -> torch.Tensor:
    """FLA's KDA gate (``fla/ops/kda/gate.py``): the per-channel log decay from the raw gate.

    With ``x = g + dt_bias.view(HV, K)`` (``dt_bias = None`` means 0):

    - ``lower_bound is None``: ``-exp(A_log[h]) * softplus(x)`` (softplus with torch's and
      FLA's threshold 20: ``x`` above it);
    - ``lower_bound`` given: ``lower_bound * sigmoid(exp(A_log[h]) * x)``, or
      ``lower_bound * sigmoid(x)`` when ``A_log`` is ``None``.

    Args:
        g: ``[..., HV, K]`` raw gate. A_log: ``[HV]`` (required without ``lower_bound``).
        dt_bias: ``[HV * K]`` or ``None``. lower_bound: a float < 0 or ``None``.

    Returns:
        ``[..., HV, K]`` in g's dtype (differentiable; parameters are cast to g's dtype).

    Raises:
        ValueError: ``A_log`` is ``None`` without ``lower_bound``.
    """
    HV, K = g.shape[-2:]
    x = g + dt_bias.to(g.dtype).view(HV, K) if dt_bias is not None else g
    if lower_bound is None:
        if A_log is None:
            raise ValueError("A_log: required unless lower_bound is given")
        a = torch.exp(A_log.to(g.dtype)).view(HV, 1)
        return -a * F.softplus(x, threshold=SOFTPLUS_THRESHOLD)
    if A_log is not None:
        x = torch.exp(A_log.to(g.dtype)).view(HV, 1) * x
    return lower_bound * torch.sigmoid(x)


def kda_recurrence_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, scale: float | None = None,
                       initial_state: torch.Tensor | None = None,
                       output_final_state: bool = False,
                       cu_seqlens: torch.Tensor | None = None, *,
                       dtype: torch.dtype | None = None,
                       use_qk_l2norm_in_kernel: bool = False,
                       use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                       dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                       use_beta_sigmoid_in_kernel: bool = False,
                       allow_neg_eigval: bool = False):
    """The KDA recurrence, one token at a time (slow; for tests and as the spec).

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, HV a multiple of H; value head ``j``
            reads q/k head ``j // (HV // H)``.
        g: ``[B, T, HV, K]`` per-channel log decay (row ``c`` of the state is multiplied by
            ``exp(g_t[c])``), or FLA's raw gate with ``use_gate_in_kernel``.
        beta: ``[B, T, HV]`` (pre-sigmoid with ``use_beta_sigmoid_in_kernel``).
        scale: output scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or ``None`` (zeros), N sequences.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (then B == 1), or ``None``
            (N = B sequences of T tokens).
        dtype: compute dtype (default q's dtype; pass ``torch.float64`` for the reference).
        use_qk_l2norm_in_kernel: L2-normalise q and k per head first (eps 1e-6).
        use_gate_in_kernel, A_log, dt_bias, lower_bound: g is the raw gate, turned into the
            log decay by :func:`kda_gate_ref` (A_log ``[HV]``, dt_bias ``[HV * K]``).
        use_beta_sigmoid_in_kernel: beta is pre-sigmoid; ``sigmoid(beta)`` is used
            (``2 * sigmoid(beta)`` with ``allow_neg_eigval``, as in FLA).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` and the ``[N, HV, K, V]`` final states
        (``None`` without ``output_final_state``), both in ``dtype``. Differentiable.
    """
    dtype = dtype or q.dtype
    gate = None
    if use_gate_in_kernel:
        def gate(g):
            return kda_gate_ref(g, A_log.to(dtype) if A_log is not None else None,
                                dt_bias.to(dtype) if dt_bias is not None else None, lower_bound)
    return delta_rule_reference(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, dtype=dtype,
        gate=gate, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
