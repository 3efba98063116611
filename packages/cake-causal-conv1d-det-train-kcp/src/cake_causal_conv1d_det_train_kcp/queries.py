"""Know before you launch: :func:`is_supported` and :func:`saved_bytes` of
:func:`~cake_causal_conv1d_det_train_kcp.causal_conv1d_det_kcp` and :func:`workspace_bytes`
of :class:`~cake_causal_conv1d_det_train_kcp.CausalConv1dDetKCPWorkspace` (the shared
rules: ``cake_core.support``; the bytes the collectives move: :func:`comm_bytes`)."""

from __future__ import annotations

import torch
from cake_causal_conv1d_det_train import CausalConv1dDetPlan
from cake_causal_conv1d_det_train.api import DET as _LOCAL
from cake_causal_conv1d_det_train.queries import workspace_bytes_for as _local_workspace_bytes
from cake_core.kcp import Context
from cake_core.support import Support, nbytes_of, support_of

from cake_causal_conv1d_det_train_kcp.api import local_fwd_checks
from cake_causal_conv1d_det_train_kcp.context import halo_plan
from cake_causal_conv1d_det_train_kcp.saved import CausalConv1dDetKCPWorkspace

__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]

_F32 = torch.float32


def is_supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 ctx: Context, *, activation: str | None = None,
                 reduce_weight_grads: bool = False, plan: CausalConv1dDetPlan | None = None,
                 workspace: CausalConv1dDetKCPWorkspace | None = None) -> Support:
    """Whether :func:`~cake_causal_conv1d_det_train_kcp.causal_conv1d_det_kcp` (and
    ``causal_conv1d_det_fwd_kcp``, without ``reduce_weight_grads``) serves this call on
    this rank (same arguments): ``Support(True, "")``, or ``Support(False, reason)`` with
    the message of the ``ValueError`` the entry would raise. Runs the entry's checks on
    this rank only: no collective (the entry's one-time agreement of the ranks,
    ``cake_core.kcp.agree_once``, is not run, so a mismatch between ranks is not seen
    here), no allocation, no launch. Never raises ``ValueError``.

    Example: ``s = is_supported(x, weight, bias, ctx, activation="silu")``, then ``if not
    s: print(s.reason)``.
    """
    return support_of(lambda: local_fwd_checks(x, weight, bias, ctx, activation, plan,
                                               workspace, reduce_weight_grads))


def workspace_bytes(plan: CausalConv1dDetPlan, ctx: Context, *,
                    dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=...)``
    allocates (the uint8 collective buffers and the nested single-rank workspace, as
    ``cake_causal_conv1d_det_train.workspace_bytes`` counts it on ``ctx.device``),
    computed without allocating.

    Raises:
        ValueError: as ``for_context``.

    Example: ``workspace_bytes(make_plan(2048, 4, torch.bfloat16, "cuda", varlen=True),
    ctx, dtype=torch.bfloat16)``.
    """
    bufs, local = CausalConv1dDetKCPWorkspace.layout(plan, ctx, dtype=dtype)
    return nbytes_of(bufs.values()) + _local_workspace_bytes(
        _LOCAL, plan, ctx.device, local["max_tokens"], local["max_seqs"])


def saved_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                ctx: Context, *, activation: str | None = None,
                reduce_weight_grads: bool = False, plan: CausalConv1dDetPlan | None = None,
                workspace: CausalConv1dDetKCPWorkspace | None = None) -> int:
    """The bytes :func:`~cake_causal_conv1d_det_train_kcp.causal_conv1d_det_kcp` (same
    arguments) allocates and keeps for the backward on this rank, computed from shapes,
    dtypes and the partition without running anything: the halo this rank's fragments
    receive (``initial_state`` of the local call, ``[n_frag * (W - 1), D]`` in x's dtype,
    when a local fragment continues a document) and the fp32 copies of a 16-bit weight
    (``[D, W]``) and bias (``[D]``) the local call runs with; 0 on a rank without tokens.
    The caller's x, weight, bias and the context's ``cu_seqlens`` are not counted. The
    checks are the entry's on this rank (no collective), which refuse meta tensors.

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes(x, weight, bias, ctx)``.
    """
    local_fwd_checks(x, weight, bias, ctx, activation, plan, workspace, reduce_weight_grads)
    if not ctx.num_tokens:
        return 0
    D, W = weight.shape
    shapes = []
    rh = halo_plan(ctx.partition, W).ranks[ctx.rank]
    if rh.has_halo:
        shapes.append(((rh.n_slots, D), x.dtype))
    if weight.dtype != _F32:
        shapes.append(((D, W), _F32))
    if bias is not None and bias.dtype != _F32:
        shapes.append(((D,), _F32))
    return nbytes_of(shapes)
