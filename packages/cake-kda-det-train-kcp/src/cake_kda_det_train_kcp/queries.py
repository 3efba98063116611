"""Know before you launch: :func:`is_supported` and :func:`saved_bytes` of
:func:`~cake_kda_det_train_kcp.chunk_kda_det_kcp` and :func:`workspace_bytes` of
:class:`~cake_kda_det_train_kcp.KDADetKCPWorkspace` (the shared rules: ``cake_core.support``;
the bytes the collectives move: :func:`comm_bytes`).

The ``*_for`` functions take the route's kinds (:class:`cake_kda_det_train_kcp.api.
KCPKinds`): cake-kda-nondet-train-kcp's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.kcp import Context
from cake_core.kcp_state import route_saved_shapes
from cake_core.linear_attention import inter_dtype
from cake_core.support import Support, nbytes_of, support_of
from cake_kda_det_train import KDADetPlan
from cake_kda_det_train.chunk import kept_a_shape
from cake_kda_det_train.plan import CHUNK_SIZE
from cake_kda_det_train.saved import workspace_layout

from cake_kda_det_train_kcp.api import DET_KCP_KINDS, KCPKinds, local_fwd_checks
from cake_kda_det_train_kcp.saved import KDADetKCPWorkspace

__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]


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


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                lower_bound: float | None = None, use_beta_sigmoid_in_kernel: bool = False,
                allow_neg_eigval: bool = False, safe_gate: bool = False,
                reduce_gate_param_grads: bool = True, plan: KDADetPlan | None = None,
                workspace: KDADetKCPWorkspace | None = None) -> int:
    """The bytes :func:`~cake_kda_det_train_kcp.chunk_kda_det_kcp` (same arguments)
    allocates on this rank and keeps for the backward, computed from shapes, dtypes, the
    plan and the partition without running anything. Per single-rank call of the route
    over ``T_g`` tokens (``cake_core.kcp_state.route_runs``): g_cumsum (fp32 ``[T_g, HV,
    K]``), A (``[2, T_g, HV, 64]`` in the intermediates' dtype), with the L2 norm the
    normalised q and k (``[T_g, H, K]`` in q's dtype) and their rstds (fp32 ``[T_g, H]``
    each); the received start states (fp32 ``[n_g, HV, K,
    V]``), copies of the inputs for a group whose fragments are not adjacent, the
    all-gather's middle-fragment transitions ``P`` (fp32 ``[n_mid, HV, K, K]``), the fp32
    copies of a 16-bit A_log / dt_bias with the in-kernel gate, a contiguous copy of an
    input that is not contiguous (``cake_core.kcp_state.route_saved_shapes``). Not
    counted: the caller's tensors and the per-context offset tables (uploaded by the first
    call on a context, shared by every later one). The checks are the entry's on this rank
    (no collective), which refuse meta tensors.

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes(q, k, v, g, beta, ctx, use_gate_in_kernel=True, A_log=A_log)``.
    """
    return saved_bytes_for(DET_KCP_KINDS, q, k, v, g, beta, ctx, scale,
                           use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                           lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                           safe_gate, reduce_gate_param_grads, plan, workspace)


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


def saved_bytes_for(kinds: KCPKinds, q, k, v, g, beta, ctx, *args) -> int:
    """:func:`saved_bytes` of the KCP forward with ``kinds`` (``args``: the entry's
    arguments after ``ctx``, in order)."""
    _, _, A_log, dt_bias, plan, _ = local_fwd_checks(q, k, v, g, beta, ctx, *args, kinds)
    use_l2 = args[1]
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    f32, idt = torch.float32, inter_dtype(plan, q.dtype)

    def per_run(grp):  # the single-rank forward's kept intermediates
        T = grp.num_tokens
        shapes = [((T, HV, K), f32), (kept_a_shape(T, HV), idt)] + \
            ([((T, H, K), q.dtype)] * 2 + [((T, H), f32)] * 2 if use_l2 else [])
        if plan.keep_states:  # h (the run's chunks), w, kg, v_new
            nc = sum(-(-ctx.fragments[i].length // CHUNK_SIZE) for i in grp.frags)
            shapes += [((nc, HV, K, V), idt), ((T, HV, K), idt), ((T, HV, K), idt),
                       ((T, HV, V), idt)]
        return shapes

    # with the L2 norm no copy of q or k is kept (the normalised ones are, per run)
    shapes = route_saved_shapes(ctx, (v, g, beta) if use_l2 else (q, k, v, g, beta), HV, K,
                                V, per_run)
    if ctx.num_tokens:  # the fp32 gate parameters the local calls keep
        shapes += [(tuple(t.shape), f32) for t in (A_log, dt_bias)
                   if t is not None and (t.dtype != f32 or not t.is_contiguous())]
    return nbytes_of(shapes)
