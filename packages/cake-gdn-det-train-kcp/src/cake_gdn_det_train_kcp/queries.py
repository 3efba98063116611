"""Know before you launch: :func:`is_supported` and :func:`saved_bytes` of
:func:`~cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp` and :func:`workspace_bytes`
of :class:`~cake_gdn_det_train_kcp.GDNDetKCPWorkspace` (the shared rules:
``cake_core.support``; the bytes the collectives move: :func:`comm_bytes`).

The ``*_for`` functions take the route's types (:class:`cake_gdn_det_train_kcp.api.
KCPModeTypes`): cake-gdn-nondet-train-kcp's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.kcp import Context
from cake_core.kcp_state import route_saved_shapes
from cake_core.linear_attention import inter_dtype
from cake_core.support import Support, nbytes_of, support_of
from cake_gdn_det_train import GDNDetPlan
from cake_gdn_det_train.plan import CHUNK_SIZE
from cake_gdn_det_train.queries import workspace_bytes_for as _local_workspace_bytes_for

from cake_gdn_det_train_kcp.api import DET, KCPModeTypes, local_fwd_checks
from cake_gdn_det_train_kcp.saved import GDNDetKCPWorkspace

__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]


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


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                use_qk_l2norm_in_kernel: bool = False, plan: GDNDetPlan | None = None,
                workspace: GDNDetKCPWorkspace | None = None) -> int:
    """The bytes :func:`~cake_gdn_det_train_kcp.chunk_gated_delta_rule_det_kcp` (same
    arguments) allocates on this rank and keeps for the backward, computed from shapes,
    dtypes, the plan and the partition without running anything. Per single-rank call of
    the route over ``T_g`` tokens and ``n_g`` fragments (``cake_core.kcp_state.route_runs``):
    g_cumsum (fp32 ``[T_g, HV]``), A (``[T_g, HV, 64]`` in the intermediates' dtype), with
    the L2 norm the normalised q and k (``[T_g, H, K]`` in q's dtype) and their rstds (fp32
    ``[T_g, H]`` each), with ``plan.keep_states`` w,
    v_new and the chunk states h, the received start states (fp32 ``[n_g, HV, K, V]``)
    of the groups that receive one, and copies of the inputs for a group whose fragments
    are not adjacent; the all-gather's middle-fragment transitions ``P`` (fp32 ``[n_mid,
    HV, K, K]``); a contiguous copy of an input that is not contiguous. Not counted: the
    caller's tensors and the per-context offset tables (the context's and its groups'
    ``cu_seqlens``, uploaded by the first call on a context and shared by every later one).
    The checks are the entry's on this rank (no collective), which refuse meta tensors.

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes(q, k, v, g, beta, ctx, use_qk_l2norm_in_kernel=True)``.
    """
    return saved_bytes_for(DET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                           workspace)


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


def saved_bytes_for(types: KCPModeTypes, q, k, v, g, beta, ctx, scale,
                    use_qk_l2norm_in_kernel, plan, workspace) -> int:
    """:func:`saved_bytes` of the KCP forward with ``types``."""
    _, plan, _ = local_fwd_checks(q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                                  workspace, types)
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    f32, idt = torch.float32, inter_dtype(plan, q.dtype)

    def per_run(grp):  # the single-rank forward's kept intermediates
        T = grp.num_tokens
        shapes = [((T, HV), f32), ((T, HV, CHUNK_SIZE), idt)]
        if use_qk_l2norm_in_kernel:  # the normalised q and k and their rstds
            shapes += [((T, H, K), q.dtype)] * 2 + [((T, H), f32)] * 2
        if plan.keep_states:
            nc = sum(-(-ctx.fragments[i].length // CHUNK_SIZE) for i in grp.frags)
            shapes += [((T, HV, K), idt), ((T, HV, V), idt), ((nc, HV, K, V), idt)]
        return shapes

    # with the L2 norm no copy of q or k is kept (the normalised ones are, per run)
    inputs = (v, g, beta) if use_qk_l2norm_in_kernel else (q, k, v, g, beta)
    return nbytes_of(route_saved_shapes(ctx, inputs, HV, K, V, per_run))
