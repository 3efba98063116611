"""Know before you launch: :func:`is_supported` of
:func:`~cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp` and :func:`workspace_bytes`
of :class:`~cake_gdn_det_train_kcp.GDNDetKCPWorkspace` (the shared rules:
``cake_core.support``; the bytes the collectives move: :func:`comm_bytes`).

The ``*_for`` functions take the route's types (:class:`cake_gdn_det_train_kcp.api.
KCPModeTypes`): cake-gdn-nondet-train-kcp's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.kcp import Context
from cake_core.support import Support, support_of
from cake_gdn_det_train import GDNDetPlan
from cake_gdn_det_train.queries import workspace_bytes_for as _local_workspace_bytes_for

from cake_gdn_det_train_kcp.api import DET, KCPModeTypes, local_fwd_checks
from cake_gdn_det_train_kcp.saved import GDNDetKCPWorkspace

__all__ = ["is_supported", "workspace_bytes"]


def is_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                 use_qk_l2norm_in_kernel: bool = False, plan: GDNDetPlan | None = None,
                 workspace: GDNDetKCPWorkspace | None = None) -> Support:
    """Whether :func:`~cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp` (and
    ``chunk_gdn_det_fwd_kcp``) serves this call on this rank (same arguments):
    ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise. Runs the entry's checks on this rank only: no
    collective (the entry's one-time agreement of the ranks, ``cake_core.kcp.agree_once``,
    is not run, so a mismatch between ranks is not seen here), no allocation of outputs, no
    launch. Never raises ``ValueError``.

    Example: ``s = is_supported(q, k, v, g, beta, ctx)``, then ``if not s: print(s.reason)``.
    """
    return is_supported_for(DET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                            workspace)


def workspace_bytes(plan: GDNDetPlan, ctx: Context, *, num_v_heads: int,
                    dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=..., dtype=...)``
    allocates (the all-gather buffers and the nested single-rank workspaces, as
    ``cake_gdn_det_train.workspace_bytes`` counts them), computed without allocating.

    Raises:
        ValueError: as ``for_context``.

    Example: ``workspace_bytes(make_plan(128, 128, torch.bfloat16, "cuda"), ctx,
    num_v_heads=32, dtype=torch.bfloat16)``.
    """
    return workspace_bytes_for(DET, plan, ctx, num_v_heads=num_v_heads, dtype=dtype)


def is_supported_for(types: KCPModeTypes, q, k, v, g, beta, ctx, scale,
                     use_qk_l2norm_in_kernel, plan, workspace) -> Support:
    """:func:`is_supported` of the KCP forward with ``types``."""
    return support_of(lambda: local_fwd_checks(q, k, v, g, beta, ctx, scale,
                                               use_qk_l2norm_in_kernel, plan, workspace, types))


def workspace_bytes_for(types: KCPModeTypes, plan, ctx, *, num_v_heads: int,
                        dtype: torch.dtype) -> int:
    """:func:`workspace_bytes` of ``types.workspace.for_context``."""
    ws = types.workspace
    return ws.layout_nbytes(plan, ctx, num_v_heads=num_v_heads, dtype=dtype,
                            local_nbytes=lambda p, **kw: _local_workspace_bytes_for(
                                ws.local_type, p, None, **kw))
