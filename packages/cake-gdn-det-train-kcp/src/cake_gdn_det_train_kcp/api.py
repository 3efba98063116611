"""Context-parallel (KCP) entries of the det chunked Gated DeltaNet.

Each rank holds the tokens of a :class:`cake_core.kcp.Partition` (its fragments, local
``[1, T_r, ...]`` tensors) and runs cake-gdn-det-train's single-rank
``chunk_gdn_det_fwd`` / ``chunk_gdn_det_bwd`` on groups of its fragments, each fragment a
separate sequence. What crosses ranks is the recurrent state S ``[HV, K, V]`` (fp32) a
document's earlier fragments leave, and in the backward its gradient.

GDN's state after a fragment is affine in the state before it: ``S_end = P S_start + Q``
(``P`` ``[HV, K, K]``: the product of the tokens' transitions ``exp(g_t) (I - beta_t k_t
k_t^T)``; ``Q``: the end state from a zero start), and the backward is the transpose,
``dS_start = P^T dS_end + G`` (``G``: the start-state gradient from the fragment's own
outputs). Two exchanges (``ctx.exchange``; ``docs/kcp.md``):

``"allgather"`` (FLA's KCP idea). A rank's fragments fall in four groups: *first* (sends a
state, receives none: starts its document), *middle* (receives and sends: its document
spans three fragments or more), *last* (receives, sends none) and *alone* (neither).
Forward: run *first* from zero (its end states are its ``Q``); for *middle*, run from zero
(``Q``) and with ``v = 0`` (width K) from the identity (``P``); post one asynchronous
all-gather of one fp32 row ``[HV, K, Wd]`` per sending fragment (``Wd = K + V`` when some
document has a middle fragment, else ``V``: only middle fragments' ``P`` is ever used);
run *alone* meanwhile; fold each receiving fragment's rows in chain order,
``S = Q_0; S = P_j S + Q_j``; then run *middle* and *last* from their folded start states.
Backward: run *last* (complete) and *middle* with ``dht = 0`` (their start-state gradients
``G``); post one all-gather of ``(P^T, G)`` rows per receiving fragment; run *alone*
meanwhile; fold each sending fragment's successors, last first,
``D = G_last; D = P_j^T D + G_j``; then run *first* and *middle* with ``do`` and
``dht = D`` (the first *middle* run only gave ``G``). Every gradient comes from one
single-rank backward with both ``do`` and ``dht``.

``"ring"``: the exact state travels along each document's chain. Forward: run this rank's
fragments at chain position 0, then for each step hand the end states on
(``batch_isend_irecv``) and run the fragments at the next position from the received
states; backward in reverse with ``dht`` the received gradients. With every cut on a
64-token chunk boundary this reproduces the single-rank package's bits.

Without any crossing document (``ctx.crosses`` false) both are one single-rank call over
all local fragments and no collective: with world size 1 the results equal the
single-rank package's bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from cake_core import (
    Mode,
    check_dtype,
    check_flag,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.kcp import Context, agree_once
from cake_core.kcp_route import (
    backward_allgather,
    backward_ring,
    forward_allgather,
    forward_ring,
)
from cake_core.kcp_state import FragmentGroups, fragment_groups
from cake_core.linear_attention import LAYOUTS, check_qkv_g_beta, resolve_plan, resolve_scale
from cake_core.triton_utils import launch_device_check
from cake_gdn_det_train import (
    GDNDetPlan,
    GDNDetSavedSet,
    chunk_gdn_det_bwd,
    chunk_gdn_det_fwd,
    make_plan,
)
from cake_gdn_det_train.plan import MAX_HEAD_DIM, cuda_plan_problem

from cake_gdn_det_train_kcp.context import LocalGroup, check_context, has_middle_fragments
from cake_gdn_det_train_kcp.exchange import (
    ring_ready,
)
from cake_gdn_det_train_kcp.saved import GDNDetKCPSavedSet, GDNDetKCPWorkspace

__all__ = [
    "GDNDetKCPGrads",
    "chunk_gated_delta_rule_det_kcp",
    "chunk_gdn_det_bwd_kcp",
    "chunk_gdn_det_fwd_kcp",
]

_F32 = torch.float32
_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


class GDNDetKCPGrads(NamedTuple):
    """Gradients of :func:`chunk_gdn_det_bwd_kcp`, rank-local, each like its input (shape
    and dtype): ``dq``, ``dk`` ``[1, T_r, H, K]``, ``dv`` ``[1, T_r, HV, V]``, ``dg``,
    ``dbeta`` ``[1, T_r, HV]``."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor


# ----------------------------------------------------------------------------- groups


_Groups = FragmentGroups  # this rank's fragment groups (cake_core.kcp_state)
_groups = fragment_groups


# ----------------------------------------------------------------------------- types


class KCPModeTypes(NamedTuple):
    """The mode-carrying types the KCP route runs with: this package's (:data:`DET`), or
    cake-gdn-nondet-train-kcp's, which runs the same route with its own types and its
    single-rank package's entries. An entry refuses objects of another type or ``mode``."""

    mode: Mode
    plan: type  # the single-rank plan class
    saved: type  # the KCP saved set class
    workspace: type  # the KCP workspace class (its ``transition_plan`` too)
    make_plan: Callable
    plans: dict  # the entries' default plans, per (K, V, dtype, device)
    local_fwd: Callable  # the single-rank forward (chunk_gdn_det_fwd's signature)
    local_bwd: Callable  # the single-rank backward (chunk_gdn_det_bwd's signature)
    grads: type
    before_bwd: Callable[[], None] | None = None  # run by a backward before any launch


# ----------------------------------------------------------------------------- checks

_DEFAULT_PLANS: dict[tuple, GDNDetPlan] = {}


def _resolve_plan(plan, K: int, V: int, dtype: torch.dtype, device: torch.device,
                  types: KCPModeTypes | None = None) -> GDNDetPlan:
    types = types or DET
    return resolve_plan(plan, K, V, dtype, device, plan_type=types.plan,
                        make_plan=types.make_plan, cuda_plan_problem=cuda_plan_problem,
                        cache=types.plans, mode=types.mode)


def _resolve_workspace(workspace, plan: GDNDetPlan, ctx: Context, HV: int,
                       dtype: torch.dtype, types: KCPModeTypes | None = None):
    if workspace is None:
        return None
    types = types or DET
    require_mode(workspace, types.workspace, types.mode, name="workspace")
    workspace.check_for(plan, ctx, HV, dtype)
    return workspace


def local_fwd_checks(q, k, v, g, beta, ctx, scale, use_l2, plan, workspace, types=None):
    """The forward's checks on this rank alone (no collective; what ``is_supported`` runs);
    returns ``(scale, plan, workspace)``. ``types``: default :data:`DET`."""
    check_context(ctx)
    B, T, H, K, HV, V = check_qkv_g_beta(q, k, v, g, beta, max_head_dim=MAX_HEAD_DIM,
                                         per_channel_decay=False)
    if B != 1:
        raise ValueError(f"q: expected the rank-local tensors [1, T_r, H, K] (packed "
                         f"fragments), got batch size {B}")
    ctx.check_num_tokens(q, "q")
    scale = resolve_scale(scale, K)
    check_flag(use_l2, "use_qk_l2norm_in_kernel")
    device = check_same_device(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    launch_device_check(device, "q")
    check_context(ctx, device)
    plan = _resolve_plan(plan, K, V, q.dtype, device, types)
    workspace = _resolve_workspace(workspace, plan, ctx, HV, q.dtype, types)
    return scale, plan, workspace


def _check_fwd(q, k, v, g, beta, ctx, scale, use_l2, plan, workspace, types=None):
    """Every check of the forward, before any allocation, launch or collective: the local
    ones, then the ranks' agreement; returns ``(scale, plan, workspace)``."""
    scale, plan, workspace = local_fwd_checks(q, k, v, g, beta, ctx, scale, use_l2, plan,
                                              workspace, types)
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    # the last check, the first collective: the ranks compare what their collectives use
    agree_once(ctx, "chunk_gdn_fwd_kcp", H=H, HV=HV, K=K, V=V, dtype=q.dtype, scale=scale,
               use_qk_l2norm_in_kernel=bool(use_l2), plan=plan)
    return scale, plan, workspace


def _check_bwd(do, saved, ctx, plan, workspace, types=None):
    """Every check of the backward, before any allocation, launch or collective; returns
    ``(plan, workspace)``. ``types``: default :data:`DET`."""
    types = types or DET
    require_mode(saved, types.saved, types.mode, name="saved")
    check_context(ctx)
    made = (saved.partition_key, saved.rank, saved.exchange)
    if made != (ctx.partition.key, ctx.rank, ctx.exchange):
        raise ValueError(f"saved: made on (partition, rank, exchange) = {made}, but ctx is "
                         f"{(ctx.partition.key, ctx.rank, ctx.exchange)}")
    check_tensor(do, "do")
    check_shape(do, "do", list(saved.v.shape), layout=LAYOUTS["do"])
    check_dtype(do, "do", _FLOAT)
    device = check_same_device(("saved", saved.v), ("do", do))
    launch_device_check(device, "do")
    check_context(ctx, device)
    K, HV, V = saved.qk_shape[3], saved.v.shape[2], saved.v.shape[3]
    plan = _resolve_plan(plan if plan is not None else saved.plan, K, V, saved.qk_dtype,
                         device, types)
    return plan, _resolve_workspace(workspace, plan, ctx, HV, saved.qk_dtype, types)


# ----------------------------------------------------------------------------- local calls


def _take(grp: LocalGroup, *xs):
    return tuple(grp.take(x) for x in xs)


def _local_fwd(grp: LocalGroup, gs: _Groups, x, scale, use_l2, plan, ws, h0, final,
               types: KCPModeTypes):
    """One single-rank forward over ``grp``'s fragments: ``(o, final_state, saved)``."""
    q, k, v, g, beta = _take(grp, *x)
    return types.local_fwd(q, k, v, g, beta, scale=scale, initial_state=h0,
                           output_final_state=final, use_qk_l2norm_in_kernel=use_l2,
                           cu_seqlens=gs.cu[grp.kind], plan=plan,
                           workspace=ws.local if ws is not None else None)


def _transition_run(grp: LocalGroup, gs: _Groups, x, use_l2, plan, ws,
                    types: KCPModeTypes) -> torch.Tensor:
    """``P`` fp32 ``[n, HV, K, K]`` of ``grp``'s fragments: the single-rank forward with
    ``v = 0`` of width K from the identity state (its final states)."""
    _, k, _, g, beta = _take(grp, *x)
    HV, K = g.shape[2], k.shape[3]
    n = len(grp.frags)
    pp = types.workspace.transition_plan(plan, k.dtype, k.device)
    pws = None
    if ws is not None:
        pws = ws.local if pp is plan else ws.local_p
    v0 = torch.zeros((1, grp.num_tokens, HV, K), dtype=k.dtype, device=k.device)
    eye = torch.eye(K, dtype=_F32, device=k.device).expand(n, HV, K, K).contiguous()
    _, P, _ = types.local_fwd(k, k, v0, g, beta, scale=1.0, initial_state=eye,
                              output_final_state=True, use_qk_l2norm_in_kernel=use_l2,
                              cu_seqlens=gs.cu[grp.kind], plan=pp, workspace=pws)
    return P


def _local_bwd(grp: LocalGroup, gs: _Groups, do, dht, saved: GDNDetSavedSet, plan, ws,
               types: KCPModeTypes):
    return types.local_bwd(grp.take(do), dht, saved, plan=plan,
                           workspace=ws.local if ws is not None else None)


# ----------------------------------------------------------------------------- forward


def _forward(q, k, v, g, beta, ctx: Context, scale, use_l2, plan, ws, types=None):
    """After :func:`_check_fwd`: ``(o, saved)``. ``types``: default :data:`DET`."""
    types = types or DET
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    x = tuple(t.contiguous() for t in (q, k, v, g, beta))
    gs = _groups(ctx)
    P = None
    with torch.no_grad():
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]

        def local_fwd(grp, h0, final):
            return _local_fwd(grp, gs, x, scale, use_l2, plan, ws, h0, final, types)

        def transition(grp):
            return _transition_run(grp, gs, x, use_l2, plan, ws, types)

        if ctx.exchange == "ring":
            runs = forward_ring(ctx, gs, ws, o, HV, K, V, local_fwd, transition, ring_ready)
        else:
            runs, P = forward_allgather(ctx, gs, ws, o, HV, K, V, local_fwd, transition)
    meta = {"partition_key": ctx.partition.key, "rank": ctx.rank,
            "world_size": ctx.world_size, "exchange": ctx.exchange,
            "num_tokens": ctx.num_tokens, "groups": tuple((g_.kind, g_.frags) for g_, _ in runs),
            "plan": plan, "scale": scale, "use_qk_l2norm": use_l2,
            "has_middle": has_middle_fragments(ctx.partition),
            # q and k themselves are not kept: the nested sets hold what the backward reads
            # (the normalised q and k with the L2 norm)
            "qk_shape": tuple(q.shape), "qk_dtype": q.dtype}
    saved = types.saved(types.mode, {"v": v, "g": g, "beta": beta, "P": P},
                        meta, tuple(s for _, s in runs))
    return o, saved


# ----------------------------------------------------------------------------- backward


def _put_grads(grp: LocalGroup, out: list[torch.Tensor], gr) -> None:
    for dst, src in zip(out, (gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta), strict=True):
        grp.put(dst, src)


def _backward(do, saved: GDNDetKCPSavedSet, ctx: Context, plan, ws,
              types=None) -> GDNDetKCPGrads:
    """After :func:`_check_bwd` (and ``types.before_bwd``). ``types``: default :data:`DET`."""
    types = types or DET
    dev = saved.v.device
    out = [torch.empty(saved.qk_shape, dtype=saved.qk_dtype, device=dev) for _ in range(2)]
    out += [torch.empty(t.shape, dtype=t.dtype, device=dev)
            for t in (saved.v, saved.g, saved.beta)]
    gs = _groups(ctx)
    with torch.no_grad():
        do = do.contiguous()

        def local_bwd(grp, dht, s):
            return _local_bwd(grp, gs, do, dht, s, plan, ws, types)

        def put(grp, gr):
            _put_grads(grp, out, gr)

        if ctx.exchange == "ring":
            backward_ring(ctx, gs, ws, saved, local_bwd, put, ring_ready)
        else:
            backward_allgather(ctx, gs, ws, saved, local_bwd, put)
    return types.grads(*out)


# ----------------------------------------------------------------------------- public API


def chunk_gdn_det_fwd_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                          use_qk_l2norm_in_kernel: bool = False,
                          plan: GDNDetPlan | None = None,
                          workspace: GDNDetKCPWorkspace | None = None):
    """Context-parallel det chunked Gated DeltaNet forward on one rank, without autograd.

    FLA's ``chunk_gated_delta_rule`` semantics (per document, from a zero state) over the
    documents of ``ctx.partition``, each rank computing its own tokens. Every rank of
    ``ctx.group`` must call it (the same number of times, in the same order, with the same
    head dims, dtype and options): a rank holding no token runs no kernel but takes part
    in every collective. As in FLA's context parallelism there is no ``initial_state`` and
    no ``final_state`` on this route.

    Args:
        q, k: rank-local ``[1, T_r, H, K]`` (``T_r = ctx.num_tokens``, this rank's
            fragments in ``ctx`` order, each a separate piece of its document), fp32, bf16
            or fp16; k of q's dtype. K <= 256 (on CUDA <= 128; fp32 K <= 64).
        v: ``[1, T_r, HV, V]`` of q's dtype, HV a positive multiple of H.
        g: ``[1, T_r, HV]`` log-decay, fp32 or q's dtype. beta: ``[1, T_r, HV]``, fp32 or
            q's dtype.
        ctx: this rank's :class:`cake_core.kcp.Context` (:func:`build_context_det_kcp`); its
            ``exchange`` picks ``"allgather"`` or ``"ring"``.
        scale: > 0, default ``K ** -0.5``.
        use_qk_l2norm_in_kernel: bool; L2-normalise q and k per head first.
        plan: a :class:`cake_gdn_det_train.GDNDetPlan` for (K, V) (default
            ``make_plan(K, V, q.dtype, device)``); the all-gather's transition run uses it
            when K == V, else ``make_plan(K, K, ...)``.
        workspace: a :class:`GDNDetKCPWorkspace` from ``for_context(plan, ctx, ...)``
            (default: scratch allocated per call).

    Returns:
        ``(o, saved)``: o ``[1, T_r, HV, V]`` in v's dtype; saved a
        :class:`GDNDetKCPSavedSet` for :func:`chunk_gdn_det_bwd_kcp`.

    Determinism: for a fixed partition, exchange and plan, o repeats bitwise on every
    rank, run after run (single-rank kernels, fixed-order fp32 folds, no all-reduce).
    Across partitions results agree within float tolerance, not bitwise, except the ring
    with every cut on a 64-token chunk boundary (``docs/kcp.md``).

    Raises:
        ValueError: bad shapes or dtypes (as the single-rank entry), a batch size other
            than 1, local tensors whose length is not ``ctx.num_tokens``, a context made for
            another rank, world size or device, a foreign plan or workspace; all before any
            allocation, launch or collective.
    """
    return fwd_kcp_entry(DET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                         workspace)


def fwd_kcp_entry(types: KCPModeTypes, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                  plan, workspace):
    """The body of :func:`chunk_gdn_det_fwd_kcp` with ``types``."""
    scale, plan, ws = _check_fwd(q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                                 workspace, types)
    return _forward(q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan, ws, types)


def chunk_gdn_det_bwd_kcp(do: torch.Tensor, saved: GDNDetKCPSavedSet, ctx: Context, *,
                          plan: GDNDetPlan | None = None,
                          workspace: GDNDetKCPWorkspace | None = None) -> GDNDetKCPGrads:
    """Backward of :func:`chunk_gdn_det_fwd_kcp` on one rank (every rank must call it).

    The gradient of each crossing state goes back to the rank it came from by the reverse
    of the forward's exchange (all-gather of ``(P^T, G)`` rows and a fold, or the ring in
    reverse order), then each local fragment runs the single-rank backward with its
    upstream ``do`` and its end-state gradient.

    Args:
        do: gradient of o, rank-local ``[1, T_r, HV, V]``, fp32/bf16/fp16.
        saved: the :class:`GDNDetKCPSavedSet` of the forward on this ``ctx``.
        ctx: the forward's context.
        plan: default: the forward's. workspace: as in :func:`chunk_gdn_det_fwd_kcp`.

    Returns:
        :class:`GDNDetKCPGrads` ``(dq, dk, dv, dg, dbeta)``, rank-local, like the inputs.

    Raises:
        ValueError: a saved set or workspace that is not this package's det type (the
            single-rank package's, a non-det one), a saved set from another context
            (partition, rank or exchange), ``do`` of the wrong shape, dtype or device, a
            foreign plan; all before any allocation, launch or collective.
    """
    return bwd_kcp_entry(DET, do, saved, ctx, plan, workspace)


def bwd_kcp_entry(types: KCPModeTypes, do, saved, ctx, plan, workspace):
    """The body of :func:`chunk_gdn_det_bwd_kcp` with ``types``: every check, then
    ``types.before_bwd`` (when set), then the route."""
    plan, ws = _check_bwd(do, saved, ctx, plan, workspace, types)
    if types.before_bwd is not None:
        types.before_bwd()
    # the first collective: the ranks compare what their collectives use
    agree_once(ctx, "chunk_gdn_bwd_kcp", HV=saved.v.shape[2], K=saved.qk_shape[3],
               V=saved.v.shape[3], dtype=saved.qk_dtype, plan=plan)
    return _backward(do, saved, ctx, plan, ws, types)


class _GDNDetKCPFunction(torch.autograd.Function):
    """Autograd of the KCP route: the saved set's tensors (own and nested) go through
    ``ctx.save_for_backward``; the KCP context, plan, workspace and the route's
    :class:`KCPModeTypes` are kept as attributes."""

    @staticmethod
    def forward(actx, q, k, v, g, beta, kcp_ctx, scale, use_l2, plan, ws, types):
        o, saved = _forward(q, k, v, g, beta, kcp_ctx, scale, use_l2, plan, ws, types)
        actx.save_for_backward(*saved.tensors())
        actx.meta, actx.kcp_ctx, actx.plan, actx.ws = saved.meta, kcp_ctx, plan, ws
        actx.types = types
        return o

    @staticmethod
    @once_differentiable
    def backward(actx, do):
        types = actx.types
        saved = types.saved.from_tensors(types.mode, actx.saved_tensors, actx.meta)
        if do is None:
            do = torch.zeros(saved.v.shape, dtype=saved.v.dtype, device=saved.v.device)
        if types.before_bwd is not None:
            types.before_bwd()
        grads = _backward(do, saved, actx.kcp_ctx, actx.plan, actx.ws, types)
        return (*grads, None, None, None, None, None, None)


@torch.compiler.disable
def chunk_gated_delta_rule_det_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   g: torch.Tensor, beta: torch.Tensor, ctx: Context, *,
                                   scale: float | None = None,
                                   use_qk_l2norm_in_kernel: bool = False,
                                   plan: GDNDetPlan | None = None,
                                   workspace: GDNDetKCPWorkspace | None = None) -> torch.Tensor:
    """Context-parallel det chunked Gated DeltaNet with autograd; returns rank-local ``o``.

    Arguments, semantics and errors as :func:`chunk_gdn_det_fwd_kcp` (no
    ``initial_state`` / ``final_state`` on this route, as in FLA's context parallelism);
    gradients flow to q, k, v, g and beta through :func:`chunk_gdn_det_bwd_kcp`'s
    algorithm. Every rank must run the forward and the backward (collectives inside).
    Not twice differentiable. ``torch.compile`` does not trace it (it runs eagerly, a
    graph break).
    """
    return autograd_kcp_entry(DET, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                              workspace)


def autograd_kcp_entry(types: KCPModeTypes, q, k, v, g, beta, ctx, scale,
                       use_qk_l2norm_in_kernel, plan, workspace) -> torch.Tensor:
    """The body of :func:`chunk_gated_delta_rule_det_kcp` with ``types``."""
    scale, plan, ws = _check_fwd(q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, plan,
                                 workspace, types)
    return _GDNDetKCPFunction.apply(q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                                    plan, ws, types)


#: this package's types: det plans, its KCP saved set and workspace, cake-gdn-det-train's
#: entries (looked up when called)
DET = KCPModeTypes(Mode.DET, GDNDetPlan, GDNDetKCPSavedSet, GDNDetKCPWorkspace, make_plan,
                   _DEFAULT_PLANS, lambda *a, **kw: chunk_gdn_det_fwd(*a, **kw),
                   lambda *a, **kw: chunk_gdn_det_bwd(*a, **kw), GDNDetKCPGrads)
