"""Know before you launch, nondet: :func:`is_supported_nondet` and
:func:`saved_bytes_nondet` of
:func:`~cake_gdn_nondet_train_kcp.chunk_gated_delta_rule_nondet_kcp` and
:func:`workspace_bytes_nondet` of :class:`~cake_gdn_nondet_train_kcp.GDNNondetKCPWorkspace`:
cake-gdn-det-train-kcp's queries with this package's types."""

from __future__ import annotations

import torch
from cake_core.kcp import Context
from cake_core.support import Support
from cake_gdn_det_train_kcp.queries import (
    is_supported_for,
    saved_bytes_for,
    workspace_bytes_for,
)
from cake_gdn_nondet_train import GDNNondetPlan

from cake_gdn_nondet_train_kcp.api import NONDET
from cake_gdn_nondet_train_kcp.saved import GDNNondetKCPWorkspace

__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]


def is_supported_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                        use_qk_l2norm_in_kernel: bool = False,
                        plan: GDNNondetPlan | None = None,
                        workspace: GDNNondetKCPWorkspace | None = None) -> Support:
    """Whether :func:`~cake_gdn_nondet_train_kcp.chunk_gated_delta_rule_nondet_kcp` (and
    ``chunk_gdn_nondet_fwd_kcp``) serves this call on this rank (same arguments):
    ``Support(True, "")`` or ``Support(False, <the entry's ValueError message>)`` (a det
    plan or workspace is refused). This rank's checks only: no collective (the ranks'
    one-time agreement is not run), no allocation of outputs, no launch; never raises
    ``ValueError``.

    Example: ``s = is_supported_nondet(q, k, v, g, beta, ctx)``, then ``if not s:
    print(s.reason)``.
    """
    return is_supported_for(NONDET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                            plan, workspace)


def workspace_bytes_nondet(plan: GDNNondetPlan, ctx: Context, *, num_v_heads: int,
                           dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``GDNNondetKCPWorkspace.for_context(plan, ctx, num_v_heads=...,
    dtype=...)`` allocates (the same arguments), computed without allocating.

    Raises:
        ValueError: as ``for_context`` (a det plan too).

    Example: ``workspace_bytes_nondet(make_nondet_plan(128, 128, torch.bfloat16, "cuda"),
    ctx, num_v_heads=32, dtype=torch.bfloat16)``.
    """
    return workspace_bytes_for(NONDET, plan, ctx, num_v_heads=num_v_heads, dtype=dtype)


def saved_bytes_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                       use_qk_l2norm_in_kernel: bool = False,
                       plan: GDNNondetPlan | None = None,
                       workspace: GDNNondetKCPWorkspace | None = None) -> int:
    """The bytes :func:`~cake_gdn_nondet_train_kcp.chunk_gated_delta_rule_nondet_kcp` (same
    arguments) allocates on this rank and keeps for the backward, as
    ``cake_gdn_det_train_kcp.saved_bytes`` counts them (the caller's tensors and the
    per-context offset tables not counted), without running anything.

    Raises:
        ValueError: as the entry (a det plan or workspace too).

    Example: ``saved_bytes_nondet(q, k, v, g, beta, ctx)``.
    """
    return saved_bytes_for(NONDET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                           workspace)
