"""Know before you launch: :func:`is_supported` of
:func:`~cake_kda_det_train_kcp.chunk_kda_det_kcp` and :func:`workspace_bytes` of
:class:`~cake_kda_det_train_kcp.KDADetKCPWorkspace` (the shared rules: ``cake_core.support``;
the bytes the collectives move: :func:`comm_bytes`).

The ``*_for`` functions take the route's kinds (:class:`cake_kda_det_train_kcp.api.
KCPKinds`): cake-kda-nondet-train-kcp's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.kcp import Context
from cake_core.support import Support, nbytes_of, support_of
from cake_kda_det_train import KDADetPlan
from cake_kda_det_train.saved import workspace_layout

from cake_kda_det_train_kcp.api import DET_KCP_KINDS, KCPKinds, local_fwd_checks
from cake_kda_det_train_kcp.saved import KDADetKCPWorkspace

__all__ = ["is_supported", "workspace_bytes"]


def is_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                 use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                 A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                 lower_bound: float | None = None, use_beta_sigmoid_in_kernel: bool = False,
                 allow_neg_eigval: bool = False, safe_gate: bool = False,
                 reduce_gate_param_grads: bool = True, plan: KDADetPlan | None = None,
                 workspace: KDADetKCPWorkspace | None = None) -> Support:
    """Whether :func:`~cake_kda_det_train_kcp.chunk_kda_det_kcp` (and
    ``chunk_kda_det_fwd_kcp``) serves this call on this rank (same arguments):
    ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise. Runs the entry's checks on this rank only: no
    collective (the entry's one-time agreement of the ranks, ``cake_core.kcp.agree_once``,
    is not run, so a mismatch between ranks is not seen here), no allocation, no launch.
    Never raises ``ValueError``.

    Example: ``s = is_supported(q, k, v, g, beta, ctx, use_gate_in_kernel=True,
    A_log=A_log)``, then ``if not s: print(s.reason)``.
    """
    return is_supported_for(DET_KCP_KINDS, q, k, v, g, beta, ctx, scale,
                            use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                            lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                            safe_gate, reduce_gate_param_grads, plan, workspace)


def workspace_bytes(plan: KDADetPlan, ctx: Context, *, num_v_heads: int,
                    dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=..., dtype=...)``
    allocates (the all-gather buffers and the nested single-rank workspaces, as
    ``cake_kda_det_train.workspace_bytes`` counts them), computed without allocating.

    Raises:
        ValueError: as ``for_context``.

    Example: ``workspace_bytes(make_plan(128, 128, torch.bfloat16, "cuda"), ctx,
    num_v_heads=32, dtype=torch.bfloat16)``.
    """
    return workspace_bytes_for(DET_KCP_KINDS, plan, ctx, num_v_heads=num_v_heads, dtype=dtype)


def is_supported_for(kinds: KCPKinds, *args) -> Support:
    """:func:`is_supported` of the KCP forward with ``kinds`` (``args``: the entry's
    arguments in order)."""
    return support_of(lambda: local_fwd_checks(*args, kinds))


def workspace_bytes_for(kinds: KCPKinds, plan, ctx, *, num_v_heads: int,
                        dtype: torch.dtype) -> int:
    """:func:`workspace_bytes` of ``kinds.workspace_type.for_context``."""
    def local_nbytes(p, *, num_v_heads, max_tokens, max_seqs, dtype):
        layout, _ = workspace_layout(kinds.plan_type, kinds.mode, p, num_v_heads, max_tokens,
                                     max_seqs, dtype)
        return nbytes_of(layout.values())

    return kinds.workspace_type.layout_nbytes(plan, ctx, num_v_heads=num_v_heads, dtype=dtype,
                                              local_nbytes=local_nbytes)
