"""Context-parallel (KCP) entries of the det chunked Kimi Delta Attention.

Each rank holds the tokens of a :class:`cake_core.kcp.Partition` (its fragments, local
``[1, T_r, ...]`` tensors) and runs cake-kda-det-train's single-rank ``chunk_kda_det_fwd``
/ ``chunk_kda_det_bwd`` on groups of its fragments, each fragment a separate sequence.
What crosses ranks is the fp32 recurrent state S ``[HV, K, V]`` a document's earlier
fragments leave, in the backward its gradient, and (``reduce_gate_param_grads``) the
gradients of the gate parameters A_log and dt_bias.

The affine summary. KDA's token step (Kimi Linear, arXiv:2510.26692; FLA's ``chunk_kda``)
is ``S <- D_t S`` with ``D_t = diag(exp(g_t))`` (one decay per key channel: row ``c`` of S
scales by ``exp(g_t[c])``), then ``S <- S + beta_t k_t (v_t - S^T k_t)^T``, i.e.

    S_t = M_t S_{t-1} + beta_t k_t v_t^T,    M_t = (I - beta_t k_t k_t^T) D_t   [K, K]

(per value head; k_t after the L2 norm, g_t after the in-kernel gate, beta_t after the
sigmoid when those options are on). Over a fragment of tokens ``1..n``

    S_end = P S_start + Q,    P = M_n ... M_1,    Q = S_end from S_start = 0

The decay no longer commutes with the rank-one factors (GDN's ``exp(g_t) I`` does), so
``P`` is a general (non-symmetric) ``[K, K]`` product; it acts on the key dim of S, as
GDN's does, so the fold and the message layout are GDN's. The backward is the transpose:
``dS_start = P^T dS_end + G``, ``G`` the start-state gradient from the fragment's own
outputs with ``dS_end = 0``. ``P`` is computed by the single-rank forward itself: the
final state of a run with ``v = 0`` (width K) from the identity start state ``I_K`` is
``P I + 0 = P`` (the same gate, L2 norm and beta options, so the same ``M_t``).
``tests/test_kda_kcp_summary.py`` checks all of this against a float64 token recurrence.

Two exchanges (``ctx.exchange``; ``docs/kcp.md``):

``"allgather"`` (FLA's KCP idea). A rank's fragments fall in four groups: *first* (sends a
state, receives none), *middle* (receives and sends), *last* (receives only), *alone*
(neither). Forward: *first* from zero (its end states are its ``Q``); *middle* from zero
(``Q``) and the transition run (``P``); one asynchronous all-gather of one fp32 row
``[HV, K, Wd]`` per sending fragment (``Wd = K + V`` when some document has a middle
fragment, else ``V``); *alone* meanwhile; each receiving fragment folds its rows in chain
order (``S = Q_0; S = P_j S + Q_j``); then *middle* and *last* from their folded states.
Backward: *last* (complete) and *middle* with ``dht = 0`` (their ``G``); one all-gather of
``(P^T, G)`` rows; *alone* meanwhile; each sending fragment folds its successors, last
first (``D = G_last; D = P_j^T D + G_j``); then *first* and *middle* with ``do`` and
``dht = D``. Every gradient comes from one single-rank backward with both ``do`` and
``dht``.

``"ring"``: the exact state travels along each document's chain, one
``batch_isend_irecv`` step per chain position, the backward in reverse. With every cut on
a 64-token chunk boundary the outputs and the per-token gradients are the single-rank
package's bits.

Without any crossing document (``ctx.crosses`` false) both are one single-rank call over
all local fragments and no state collective: with world size 1 the results equal the
single-rank package's bitwise.

Gate parameters. The local calls get fp32 copies of A_log / dt_bias (the gate reads them
as fp32 either way: same forward bits) so their backward returns fp32 sums; a rank adds
its calls' sums in call order (its *share*), then with ``reduce_gate_param_grads`` one
all-gather of every rank's share and a sum in rank order gives every rank the same bits;
one cast to the parameter's dtype at the end.
"""

from __future__ import annotations

import math
import numbers
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
from cake_core.linear_attention import (
    LAYOUTS,
    check_gate_params,
    check_options,
    check_qkv_g_beta,
    resolve_plan,
    resolve_scale,
)
from cake_core.triton_utils import launch_device_check
from cake_kda_det_train import (
    KDADetPlan,
    KDADetSavedSet,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    make_plan,
)
from cake_kda_det_train.api import SAFE_GATE_RANGE
from cake_kda_det_train.plan import MAX_HEAD_DIM, cuda_plan_problem

from cake_kda_det_train_kcp.context import (
    LocalGroup,
    check_context,
    gate_grad_width,
    has_middle_fragments,
)
from cake_kda_det_train_kcp.exchange import (
    ring_ready,
    sum_over_ranks,
)
from cake_kda_det_train_kcp.saved import KDADetKCPSavedSet, KDADetKCPWorkspace, p_plan

__all__ = [
    "KDADetKCPGrads",
    "chunk_kda_det_bwd_kcp",
    "chunk_kda_det_fwd_kcp",
    "chunk_kda_det_kcp",
]

_F32 = torch.float32
_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


class KDADetKCPGrads(NamedTuple):
    """Gradients of :func:`chunk_kda_det_bwd_kcp`, rank-local, each like its input (shape
    and dtype): ``dq``, ``dk`` ``[1, T_r, H, K]``, ``dv`` ``[1, T_r, HV, V]``, ``dg``
    ``[1, T_r, HV, K]`` (w.r.t. the raw gate with ``use_gate_in_kernel``), ``dbeta``
    ``[1, T_r, HV]`` (w.r.t. the pre-sigmoid beta with ``use_beta_sigmoid_in_kernel``).
    ``dA_log`` ``[HV]`` / ``ddt_bias`` ``[HV * K]`` in A_log's / dt_bias's dtype with
    ``use_gate_in_kernel`` and that parameter, else ``None``: the sum over every rank's
    tokens (equal bits on every rank) with ``reduce_gate_param_grads``, else this rank's
    share."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dg: torch.Tensor
    dbeta: torch.Tensor
    dA_log: torch.Tensor | None = None
    ddt_bias: torch.Tensor | None = None


class _Opts(NamedTuple):
    """The checked options of a call (the gate parameters as fp32 for the local calls)."""

    scale: float
    use_l2: bool
    use_gate: bool
    A_log32: torch.Tensor | None
    dt_bias32: torch.Tensor | None
    lower_bound: float | None
    use_sigmoid: bool
    allow_neg_eigval: bool
    safe_gate: bool
    reduce: bool

    def local_kwargs(self) -> dict:
        """Keyword arguments of every single-rank call (but scale)."""
        return dict(use_qk_l2norm_in_kernel=self.use_l2, use_gate_in_kernel=self.use_gate,
                    A_log=self.A_log32, dt_bias=self.dt_bias32, lower_bound=self.lower_bound,
                    use_beta_sigmoid_in_kernel=self.use_sigmoid,
                    allow_neg_eigval=self.allow_neg_eigval, safe_gate=self.safe_gate)


# ----------------------------------------------------------------------------- groups


_Groups = FragmentGroups  # this rank's fragment groups (cake_core.kcp_state)
_groups = fragment_groups


# ----------------------------------------------------------------------------- kinds


class KCPKinds(NamedTuple):
    """What makes a KCP package's entries det or nondet over this module's checks, exchange
    and folds (this package's :data:`DET_KCP_KINDS`; cake-kda-nondet-train-kcp builds its
    own): the mode its objects carry, the single-rank plan class, rule and default-plan
    cache, its KCP saved set, workspace and gradients classes, the single-rank forward and
    backward each rank runs (``chunk_kda_det_fwd`` / ``_bwd``'s signatures), the plan of the
    transition run, and what its backward runs before any launch or collective (``None``:
    nothing; nondet: the deterministic-algorithms alert)."""

    mode: Mode
    plan_type: type
    make_plan: Callable
    plan_cache: dict
    saved_type: type
    workspace_type: type
    grads_type: type
    local_fwd: Callable
    local_bwd: Callable
    transition_plan: Callable
    before_bwd: Callable[[], None] | None = None


# ----------------------------------------------------------------------------- checks

_DEFAULT_PLANS: dict[tuple, KDADetPlan] = {}


def _resolve_plan(plan, K: int, V: int, dtype: torch.dtype, device: torch.device,
                  kinds: KCPKinds) -> KDADetPlan:
    return resolve_plan(plan, K, V, dtype, device, plan_type=kinds.plan_type,
                        make_plan=kinds.make_plan, cuda_plan_problem=cuda_plan_problem,
                        cache=kinds.plan_cache, mode=kinds.mode)


def _resolve_workspace(workspace, plan: KDADetPlan, ctx: Context, HV: int,
                       dtype: torch.dtype, kinds: KCPKinds) -> KDADetKCPWorkspace | None:
    if workspace is None:
        return None
    require_mode(workspace, kinds.workspace_type, kinds.mode, name="workspace")
    workspace.check_for(plan, ctx, HV, dtype)
    return workspace


def _check_lower_bound(lower_bound: object) -> float | None:
    """The single-rank package's rule: ``None`` or a finite real < 0 (not a bool)."""
    if lower_bound is None:
        return None
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, numbers.Real) or \
            not math.isfinite(lower_bound) or lower_bound >= 0:
        raise ValueError(f"lower_bound: expected None or a finite number < 0, got "
                         f"{lower_bound!r}")
    return float(lower_bound)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """An fp32 contiguous copy of a gate parameter (the tensor itself when it already is
    one), detached: the gate reads parameters as fp32, so the forward's bits do not
    change, and the local backward then returns fp32 sums."""
    return t.detach().to(_F32).contiguous() if t is not None else None


def local_fwd_checks(q, k, v, g, beta, ctx, scale, use_l2, use_gate, A_log, dt_bias,
                     lower_bound, use_sigmoid, allow_neg_eigval, safe_gate, reduce, plan,
                     workspace, kinds):
    """The forward's checks on this rank alone (the single-rank entry's rules on the
    rank-local tensors, then the context's; no allocation, launch or collective: what
    ``is_supported`` runs); returns ``(scale, lower_bound, A_log, dt_bias, plan,
    workspace)`` with the gate parameters set to ``None`` where FLA ignores them (without
    ``use_gate_in_kernel``)."""
    check_context(ctx)
    B, T, H, K, HV, V = check_qkv_g_beta(q, k, v, g, beta, max_head_dim=MAX_HEAD_DIM,
                                         per_channel_decay=True)
    if B != 1:
        raise ValueError(f"q: expected the rank-local tensors [1, T_r, H, K] (packed "
                         f"fragments), got batch size {B}")
    ctx.check_num_tokens(q, "q")
    scale = resolve_scale(scale, K)
    check_options(False, use_l2, use_gate, use_sigmoid, allow_neg_eigval, safe_gate=safe_gate,
                  reduce_gate_param_grads=reduce)
    lower_bound = _check_lower_bound(lower_bound)
    if use_gate:
        if safe_gate:
            lo, hi = SAFE_GATE_RANGE
            if lower_bound is None or not lo <= lower_bound < hi:
                raise ValueError(f"lower_bound: safe_gate=True with use_gate_in_kernel=True "
                                 f"needs lower_bound in [{lo:g}, {hi:g}) (FLA's rule), got "
                                 f"{lower_bound!r}")
        if A_log is None and lower_bound is None:
            raise ValueError("A_log: required with use_gate_in_kernel=True unless lower_bound "
                             "is given (the gate is -exp(A_log) * softplus(g + dt_bias))")
        check_gate_params(q.dtype, (A_log, "A_log", [HV]), (dt_bias, "dt_bias", [HV * K]))
    else:
        A_log = dt_bias = lower_bound = None
    device = check_same_device(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                               ("A_log", A_log), ("dt_bias", dt_bias))
    launch_device_check(device, "q")
    check_context(ctx, device)
    plan = _resolve_plan(plan, K, V, q.dtype, device, kinds)
    ws = _resolve_workspace(workspace, plan, ctx, HV, q.dtype, kinds)
    return scale, lower_bound, A_log, dt_bias, plan, ws


def _check_fwd(q, k, v, g, beta, ctx, scale, use_l2, use_gate, A_log, dt_bias, lower_bound,
               use_sigmoid, allow_neg_eigval, safe_gate, reduce, plan, workspace, kinds):
    """Every check of the forward, before any allocation, launch or collective: the local
    ones (:func:`local_fwd_checks`), then the ranks' agreement; returns ``(opts, A_log,
    dt_bias, plan, workspace)``."""
    scale, lower_bound, A_log, dt_bias, plan, ws = local_fwd_checks(
        q, k, v, g, beta, ctx, scale, use_l2, use_gate, A_log, dt_bias, lower_bound,
        use_sigmoid, allow_neg_eigval, safe_gate, reduce, plan, workspace, kinds)
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    opts = _Opts(scale, use_l2, use_gate, _f32(A_log), _f32(dt_bias), lower_bound,
                 use_sigmoid, allow_neg_eigval, safe_gate, reduce)
    # the last check, the first collective: the ranks compare what their collectives use
    agree_once(ctx, "chunk_kda_fwd_kcp", H=H, HV=HV, K=K, V=V, dtype=q.dtype, scale=scale,
               use_qk_l2norm_in_kernel=bool(use_l2), use_gate_in_kernel=bool(use_gate),
               gate_params=(A_log is not None, dt_bias is not None), lower_bound=lower_bound,
               use_sigmoid=use_sigmoid, allow_neg_eigval=allow_neg_eigval,
               safe_gate=safe_gate, reduce_gate_param_grads=reduce, plan=plan)
    return opts, A_log, dt_bias, plan, ws


def _check_bwd(do, saved, ctx, plan, workspace, reduce, kinds):
    """Every check of the backward, before any allocation, launch or collective; returns
    ``(plan, workspace, reduce)``."""
    require_mode(saved, kinds.saved_type, kinds.mode, name="saved")
    check_context(ctx)
    made = (saved.partition_key, saved.rank, saved.exchange)
    if made != (ctx.partition.key, ctx.rank, ctx.exchange):
        raise ValueError(f"saved: made on (partition, rank, exchange) = {made}, but ctx is "
                         f"{(ctx.partition.key, ctx.rank, ctx.exchange)}")
    check_tensor(do, "do")
    check_shape(do, "do", list(saved.v.shape), layout=LAYOUTS["do"])
    check_dtype(do, "do", _FLOAT)
    if reduce is None:
        reduce = saved.reduce_gate_param_grads
    check_flag(reduce, "reduce_gate_param_grads")
    device = check_same_device(("saved", saved.v), ("do", do))
    launch_device_check(device, "do")
    check_context(ctx, device)
    K, HV, V = saved.qk_shape[3], saved.v.shape[2], saved.v.shape[3]
    plan = _resolve_plan(plan if plan is not None else saved.plan, K, V, saved.qk_dtype,
                         device, kinds)
    return plan, _resolve_workspace(workspace, plan, ctx, HV, saved.qk_dtype, kinds), reduce


# ----------------------------------------------------------------------------- local calls


def _take(grp: LocalGroup, *xs):
    return tuple(grp.take(x) for x in xs)


def _local_fwd(grp: LocalGroup, gs: _Groups, x, opts: _Opts, plan, ws, h0, final,
               kinds: KCPKinds):
    """One single-rank forward over ``grp``'s fragments: ``(o, final_state, saved)``."""
    q, k, v, g, beta = _take(grp, *x)
    return kinds.local_fwd(q, k, v, g, beta, scale=opts.scale, initial_state=h0,
                           output_final_state=final, cu_seqlens=gs.cu[grp.kind], plan=plan,
                           workspace=ws.local if ws is not None else None,
                           **opts.local_kwargs())


def _transition_run(grp: LocalGroup, gs: _Groups, x, opts: _Opts, plan, ws,
                    kinds: KCPKinds) -> torch.Tensor:
    """``P`` fp32 ``[n, HV, K, K]`` of ``grp``'s fragments: the single-rank forward with the
    same k, g, beta and options, ``v = 0`` of width K and the identity start state per
    value head (its final states: ``P I + 0``)."""
    _, k, _, g, beta = _take(grp, *x)
    HV, K = g.shape[2], k.shape[3]
    n = len(grp.frags)
    pp = kinds.transition_plan(plan, k.dtype, k.device)
    pws = None
    if ws is not None:
        pws = ws.local if pp is plan else ws.local_p
    v0 = torch.zeros((1, grp.num_tokens, HV, K), dtype=k.dtype, device=k.device)
    eye = torch.eye(K, dtype=_F32, device=k.device).expand(n, HV, K, K).contiguous()
    _, P, _ = kinds.local_fwd(k, k, v0, g, beta, scale=1.0, initial_state=eye,
                              output_final_state=True, cu_seqlens=gs.cu[grp.kind], plan=pp,
                              workspace=pws, **opts.local_kwargs())
    return P


def _local_bwd(grp: LocalGroup, do, dht, saved: KDADetSavedSet, plan, ws, kinds: KCPKinds):
    return kinds.local_bwd(grp.take(do), dht, saved, plan=plan,
                           workspace=ws.local if ws is not None else None)


# ----------------------------------------------------------------------------- forward


def _forward(q, k, v, g, beta, A_log, dt_bias, ctx: Context, opts: _Opts, plan, ws,
             kinds: KCPKinds):
    """After :func:`_check_fwd`: ``(o, saved)``."""
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    x = tuple(t.contiguous() for t in (q, k, v, g, beta))
    gs = _groups(ctx)
    P = None
    with torch.no_grad():
        HV, K, V = v.shape[2], q.shape[3], v.shape[3]

        def local_fwd(grp, h0, final):
            return _local_fwd(grp, gs, x, opts, plan, ws, h0, final, kinds)

        def transition(grp):
            return _transition_run(grp, gs, x, opts, plan, ws, kinds)

        if ctx.exchange == "ring":
            runs = forward_ring(ctx, gs, ws, o, HV, K, V, local_fwd, transition, ring_ready)
        else:
            runs, P = forward_allgather(ctx, gs, ws, o, HV, K, V, local_fwd, transition)
    meta = {"partition_key": ctx.partition.key, "rank": ctx.rank,
            "world_size": ctx.world_size, "exchange": ctx.exchange,
            "num_tokens": ctx.num_tokens, "groups": tuple((g_.kind, g_.frags) for g_, _ in runs),
            "plan": plan, "scale": opts.scale, "use_qk_l2norm": opts.use_l2,
            "use_gate_in_kernel": opts.use_gate, "lower_bound": opts.lower_bound,
            "use_beta_sigmoid_in_kernel": opts.use_sigmoid,
            "allow_neg_eigval": opts.allow_neg_eigval, "safe_gate": opts.safe_gate,
            "reduce_gate_param_grads": opts.reduce,
            "has_middle": has_middle_fragments(ctx.partition),
            # q and k themselves are not kept: the nested sets hold what the backward reads
            # (the normalised q and k with the L2 norm)
            "qk_shape": tuple(q.shape), "qk_dtype": q.dtype}
    own = {"v": v, "g": g, "beta": beta, "A_log": A_log, "dt_bias": dt_bias, "P": P}
    saved = kinds.saved_type(kinds.mode, own, meta, tuple(s for _, s in runs))
    return o, saved


# ----------------------------------------------------------------------------- backward


class _Out:
    """The rank-local gradients being filled, and this rank's gate-parameter sums (fp32,
    one per gradient-producing single-rank call, in call order)."""

    def __init__(self, saved: KDADetKCPSavedSet):
        dev = saved.v.device
        self.grads = [torch.empty(saved.qk_shape, dtype=saved.qk_dtype, device=dev)
                      for _ in range(2)]
        self.grads += [torch.empty(t.shape, dtype=t.dtype, device=dev)
                       for t in (saved.v, saved.g, saved.beta)]
        self.gate: list[torch.Tensor] = []
        self.has_a = saved.use_gate_in_kernel and saved.A_log is not None
        self.has_b = saved.use_gate_in_kernel and saved.dt_bias is not None

    def put(self, grp: LocalGroup, gr) -> None:
        for dst, src in zip(self.grads, (gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta), strict=True):
            grp.put(dst, src)
        parts = ([gr.dA_log] if self.has_a else []) + ([gr.ddt_bias] if self.has_b else [])
        if parts:
            self.gate.append(torch.cat(parts) if len(parts) > 1 else parts[0])


def _gate_grads(saved: KDADetKCPSavedSet, ctx: Context, out: _Out, reduce: bool):
    """``(dA_log, ddt_bias)``: this rank's share (its calls' fp32 sums added in call order;
    zeros without tokens), summed over the ranks in rank order with ``reduce``, cast once
    to each parameter's dtype."""
    if not (out.has_a or out.has_b):
        return None, None
    HV, K = saved.v.shape[2], saved.qk_shape[3]
    n = gate_grad_width(HV, K, out.has_a, out.has_b)
    if out.gate:
        share = out.gate[0]
        for part in out.gate[1:]:
            share = share + part
    else:
        share = torch.zeros((n,), dtype=_F32, device=saved.v.device)
    if reduce:
        share = sum_over_ranks(share, ctx)
    dA_log = share[:HV].to(saved.A_log.dtype) if out.has_a else None
    ddt_bias = share[n - HV * K:].to(saved.dt_bias.dtype) if out.has_b else None
    return dA_log, ddt_bias


def _backward(do, saved: KDADetKCPSavedSet, ctx: Context, plan, ws, reduce: bool,
              kinds: KCPKinds) -> KDADetKCPGrads:
    """After :func:`_check_bwd`: ``kinds.before_bwd``, then the exchange and launches."""
    if kinds.before_bwd is not None:
        kinds.before_bwd()
    # the first collective: the ranks compare what their collectives use
    agree_once(ctx, "chunk_kda_bwd_kcp", HV=saved.v.shape[2], K=saved.qk_shape[3],
               V=saved.v.shape[3], dtype=saved.qk_dtype, reduce_gate_param_grads=bool(reduce),
               plan=plan)
    out = _Out(saved)
    gs = _groups(ctx)
    with torch.no_grad():
        do = do.contiguous()

        def local_bwd(grp, dht, s):
            return _local_bwd(grp, do, dht, s, plan, ws, kinds)

        if ctx.exchange == "ring":
            backward_ring(ctx, gs, ws, saved, local_bwd, out.put, ring_ready)
        else:
            backward_allgather(ctx, gs, ws, saved, local_bwd, out.put)
        dA_log, ddt_bias = _gate_grads(saved, ctx, out, reduce)
    return kinds.grads_type(*out.grads, dA_log, ddt_bias)


# ----------------------------------------------------------------------------- public API


def chunk_kda_det_fwd_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                          use_qk_l2norm_in_kernel: bool = False,
                          use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                          dt_bias: torch.Tensor | None = None,
                          lower_bound: float | None = None,
                          use_beta_sigmoid_in_kernel: bool = False,
                          allow_neg_eigval: bool = False, safe_gate: bool = False,
                          reduce_gate_param_grads: bool = True,
                          plan: KDADetPlan | None = None,
                          workspace: KDADetKCPWorkspace | None = None):
    """Context-parallel det chunked Kimi Delta Attention forward on one rank, no autograd.

    FLA's ``chunk_kda`` semantics (per document, from a zero state; Kimi Linear,
    arXiv:2510.26692) over the documents of ``ctx.partition``, each rank computing its own
    tokens: per value head ``S <- diag(exp(g_t)) S; S <- S + beta_t k_t (v_t - S^T k_t)^T;
    o_t = scale S^T q_t``. Every rank of ``ctx.group`` must call it (the same number of
    times, in the same order, with the same head dims, dtype and options, and equal
    A_log / dt_bias): a rank holding no token runs no kernel but joins every collective.
    As in FLA's context parallelism there is no ``initial_state`` / ``final_state``.

    Args:
        q, k: rank-local ``[1, T_r, H, K]`` (``T_r = ctx.num_tokens``: this rank's
            fragments in ``ctx`` order, each a separate piece of its document), fp32, bf16
            or fp16; k of q's dtype. 1 <= K <= 256 (CUDA: <= 128).
        v: ``[1, T_r, HV, V]`` of q's dtype, HV a positive multiple of H.
        g: ``[1, T_r, HV, K]`` per-channel log decay (or FLA's raw gate with
            ``use_gate_in_kernel``), fp32 or q's dtype.
        beta: ``[1, T_r, HV]``, fp32 or q's dtype (pre-sigmoid with
            ``use_beta_sigmoid_in_kernel``).
        ctx: this rank's :class:`cake_core.kcp.Context` (:func:`build_context_det_kcp`);
            its ``exchange`` picks ``"allgather"`` or ``"ring"``.
        scale: finite > 0, default ``K ** -0.5``.
        use_qk_l2norm_in_kernel: bool; L2-normalise q and k per head first.
        use_gate_in_kernel, A_log, dt_bias, lower_bound: FLA's in-kernel gate, as
            cake-kda-det-train's ``chunk_kda_det_fwd``: with ``x = g + dt_bias.view(HV, K)``
            the decay is ``-exp(A_log[h]) * softplus(x)``, or ``lower_bound *
            sigmoid(exp(A_log[h]) * x)`` with a ``lower_bound`` < 0. A_log ``[HV]``,
            dt_bias ``[HV * K]`` (fp32 or q's dtype): replicated parameters, the same on
            every rank. Ignored (but lower_bound checked) without ``use_gate_in_kernel``.
        use_beta_sigmoid_in_kernel, allow_neg_eigval: beta' = sigmoid(beta) (``2 *
            sigmoid(beta)`` with allow_neg_eigval, which needs the sigmoid).
        safe_gate: validated as FLA (with the gate it needs lower_bound in [-5, 0)).
        reduce_gate_param_grads: bool, default True. With the in-kernel gate, the
            backward returns dA_log / ddt_bias summed over every rank's tokens (an
            all-gather of each rank's fp32 share and a sum in rank order: equal bits on
            every rank). False: each rank returns its own share, for the caller's own
            reduction (e.g. a framework that already sums parameter gradients over the
            context-parallel group; passing True there would count them ``W`` times).
        plan: a :class:`cake_kda_det_train.KDADetPlan` for (K, V) (default
            ``make_plan(K, V, q.dtype, device)``); the all-gather's transition run uses it
            when K == V, else ``make_plan(K, K, ...)``.
        workspace: a :class:`KDADetKCPWorkspace` from ``for_context(plan, ctx, ...)``
            (default: scratch allocated per call).

    Returns:
        ``(o, saved)``: o ``[1, T_r, HV, V]`` in v's dtype; saved a
        :class:`KDADetKCPSavedSet` for :func:`chunk_kda_det_bwd_kcp`.

    Determinism: for a fixed partition, exchange and plan, o repeats bitwise on every
    rank, run after run (single-rank det kernels, fixed-order fp32 folds, no all-reduce).
    Across partitions results agree within float tolerance, not bitwise, except the ring
    with every cut on a 64-token chunk boundary (``docs/kcp.md``).

    Raises:
        ValueError: bad shapes, dtypes, flags, scale, gate options (the single-rank
            entry's rules), a batch size other than 1, local tensors whose length is not
            ``ctx.num_tokens``, a context made for another rank, world size or device, a
            foreign plan or workspace; all before any allocation, launch or collective.
            Nothing the caller passed is modified.
    """
    return run_fwd_kcp(DET_KCP_KINDS, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                       use_gate_in_kernel, A_log, dt_bias, lower_bound,
                       use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                       reduce_gate_param_grads, plan, workspace)


def chunk_kda_det_bwd_kcp(do: torch.Tensor, saved: KDADetKCPSavedSet, ctx: Context, *,
                          reduce_gate_param_grads: bool | None = None,
                          plan: KDADetPlan | None = None,
                          workspace: KDADetKCPWorkspace | None = None) -> KDADetKCPGrads:
    """Backward of :func:`chunk_kda_det_fwd_kcp` on one rank (every rank must call it).

    The gradient of each crossing state goes back to the rank it came from by the reverse
    of the forward's exchange (an all-gather of ``(P^T, G)`` rows and a fold, or the ring
    in reverse order), then each local fragment runs the single-rank backward with its
    upstream ``do`` and its end-state gradient; with the in-kernel gate the gate-parameter
    gradients are summed (below).

    Args:
        do: gradient of o, rank-local ``[1, T_r, HV, V]``, fp32/bf16/fp16.
        saved: the :class:`KDADetKCPSavedSet` of the forward on this ``ctx``.
        ctx: the forward's context.
        reduce_gate_param_grads: ``None`` (default): the forward's choice; a bool
            overrides it (the same on every rank).
        plan: default: the forward's. workspace: as in :func:`chunk_kda_det_fwd_kcp`.

    Returns:
        :class:`KDADetKCPGrads` ``(dq, dk, dv, dg, dbeta, dA_log, ddt_bias)``, rank-local
        like the inputs; dA_log / ddt_bias ``None`` without the in-kernel gate (or that
        parameter), else over all ranks (equal bits everywhere) or this rank's share.

    Raises:
        ValueError: a saved set or workspace that is not this package's det type (the
            single-rank package's, a non-det one), a saved set from another context
            (partition, rank or exchange), ``do`` of the wrong shape, dtype or device, a
            non-bool ``reduce_gate_param_grads``, a foreign plan; all before any
            allocation, launch or collective.
    """
    return run_bwd_kcp(DET_KCP_KINDS, do, saved, ctx, reduce_gate_param_grads, plan, workspace)


class _KDAKCPFunction(torch.autograd.Function):
    """Autograd of the KCP route: the saved set's tensors (own and nested) go through
    ``ctx.save_for_backward``; the KCP context, options, plan, workspace and kinds are
    kept as attributes."""

    @staticmethod
    def forward(actx, q, k, v, g, beta, A_log, dt_bias, kcp_ctx, opts, plan, ws, kinds):
        o, saved = _forward(q, k, v, g, beta, A_log, dt_bias, kcp_ctx, opts, plan, ws, kinds)
        actx.save_for_backward(*saved.tensors())
        actx.meta, actx.kcp_ctx, actx.plan, actx.ws = saved.meta, kcp_ctx, plan, ws
        actx.kinds = kinds
        return o

    @staticmethod
    @once_differentiable
    def backward(actx, do):
        kinds = actx.kinds
        saved = kinds.saved_type.from_tensors(kinds.mode, actx.saved_tensors, actx.meta)
        if do is None:
            do = torch.zeros(saved.v.shape, dtype=saved.v.dtype, device=saved.v.device)
        gr = _backward(do, saved, actx.kcp_ctx, actx.plan, actx.ws,
                       saved.reduce_gate_param_grads, kinds)
        return (*gr, None, None, None, None, None)


# ----------------------------------------------------------------------------- entry bodies
# The bodies of the three entries for any KCPKinds: this package's entries run them with
# DET_KCP_KINDS, cake-kda-nondet-train-kcp's with its own.

#: this package's kinds: det plans, KCP saved sets and workspaces, cake-kda-det-train's
#: single-rank entries (looked up per call)
DET_KCP_KINDS = KCPKinds(
    Mode.DET, KDADetPlan, make_plan, _DEFAULT_PLANS, KDADetKCPSavedSet, KDADetKCPWorkspace,
    KDADetKCPGrads, lambda *a, **kw: chunk_kda_det_fwd(*a, **kw),
    lambda *a, **kw: chunk_kda_det_bwd(*a, **kw), p_plan)


def run_fwd_kcp(kinds: KCPKinds, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, A_log, dt_bias, lower_bound, use_beta_sigmoid_in_kernel,
                allow_neg_eigval, safe_gate, reduce_gate_param_grads, plan, workspace):
    """The body of :func:`chunk_kda_det_fwd_kcp` for ``kinds``: ``(o, saved)``."""
    opts, A_log, dt_bias, plan, ws = _check_fwd(
        q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
        dt_bias, lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
        reduce_gate_param_grads, plan, workspace, kinds)
    return _forward(q, k, v, g, beta, A_log, dt_bias, ctx, opts, plan, ws, kinds)


def run_bwd_kcp(kinds: KCPKinds, do, saved, ctx, reduce_gate_param_grads, plan, workspace):
    """The body of :func:`chunk_kda_det_bwd_kcp` for ``kinds``: a ``kinds.grads_type``."""
    plan, ws, reduce = _check_bwd(do, saved, ctx, plan, workspace, reduce_gate_param_grads,
                                  kinds)
    return _backward(do, saved, ctx, plan, ws, reduce, kinds)


def run_autograd_kcp(kinds: KCPKinds, q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel,
                     use_gate_in_kernel, A_log, dt_bias, lower_bound,
                     use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                     reduce_gate_param_grads, plan, workspace):
    """The body of :func:`chunk_kda_det_kcp` for ``kinds``: the rank-local ``o``."""
    opts, A_log, dt_bias, plan, ws = _check_fwd(
        q, k, v, g, beta, ctx, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
        dt_bias, lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
        reduce_gate_param_grads, plan, workspace, kinds)
    return _KDAKCPFunction.apply(q, k, v, g, beta, A_log, dt_bias, ctx, opts, plan, ws, kinds)


@torch.compiler.disable
def chunk_kda_det_kcp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, ctx: Context, *, scale: float | None = None,
                      use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                      A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                      lower_bound: float | None = None,
                      use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                      safe_gate: bool = False, reduce_gate_param_grads: bool = True,
                      plan: KDADetPlan | None = None,
                      workspace: KDADetKCPWorkspace | None = None) -> torch.Tensor:
    """Context-parallel det chunked Kimi Delta Attention with autograd; returns the
    rank-local ``o`` ``[1, T_r, HV, V]``.

    Arguments, semantics and errors as :func:`chunk_kda_det_fwd_kcp` (no ``initial_state``
    / ``final_state`` on this route, as in FLA's context parallelism); gradients flow to q,
    k, v, g, beta and, with the in-kernel gate, A_log and dt_bias (summed over the ranks
    with ``reduce_gate_param_grads``, the default; this rank's share without) through
    :func:`chunk_kda_det_bwd_kcp`'s algorithm. Every rank must run the forward and the
    backward (collectives inside). Not twice differentiable. ``torch.compile`` does not
    trace it (it runs eagerly, a graph break).
    """
    return run_autograd_kcp(DET_KCP_KINDS, q, k, v, g, beta, ctx, scale,
                            use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                            lower_bound, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                            safe_gate, reduce_gate_param_grads, plan, workspace)
