"""Context-parallel (KCP) entries of the det causal depthwise conv1d.

Each rank holds the tokens of a :class:`cake_core.kcp.Partition` (its fragments, a local
``[1, T_r, D]`` tensor, token-major) and runs cake-causal-conv1d-det-train's single-rank
``causal_conv1d_det_fwd`` / ``causal_conv1d_det_bwd`` once over all its fragments, each
fragment a separate sequence (``ctx.cu_seqlens``). Math (Dao-AILab ``causal_conv1d_fn``,
FLA ``ShortConvolution``), per document, channel c, position t::

    y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c])

with inputs before the document start 0. A fragment that continues a document needs the
``W - 1`` inputs just before it, the *halo*, which live on earlier fragments: on this rank
or on one or more earlier ranks (fragments shorter than ``W - 1`` make a halo span
several). The single-rank kernels take exactly that as ``initial_state`` ``[N, D, W - 1]``
(slot ``k``: the input ``W - 1 - k`` positions before the sequence start), and their
backward returns ``dinitial_state``, the gradient of those rows. So:

forward: (1) one all-gather of the rows every rank gives others (``ctx.halo_send``), sent
as bytes of x's dtype (exact copies); (2) each rank assembles its fragments' halos
(``ctx.halo``: own rows copied, others' read from the gathered buffer, zero before a
document start); (3) one single-rank forward with ``initial_state`` = the halos (none
when no local fragment continues a document: then it is exactly the single-rank call).

backward: (1) one single-rank backward (``dinitial_state`` = the halo gradients, dweight
and dbias = this rank's share: every (output, tap) pair is counted by the rank that holds
the output); (2) one all-gather of the halo gradients of the rows other ranks gave, plus,
with ``reduce_weight_grads``, every rank's fp32 dweight / dbias share; (3) each token
that sat in a later fragment's halo gets those gradients added to its input gradient, in
fp32, in document order after its local gradient; (4) with ``reduce_weight_grads`` the
shares are summed in rank order (``((s_0 + s_1) + s_2) + ...``), so every rank gets the
same bits, then cast once to weight's / bias's dtype.

The local calls run with fp32 copies of a 16-bit weight / bias (the kernels read them as
fp32 anyway: same outputs), so the shares stay fp32 until the one final cast. Collectives
run only when a halo row crosses a rank (or the weight gradients are reduced), decided
from the partition, so every rank joins or skips each one together; a rank without
tokens runs no kernel and still joins every collective.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetPlan,
    CausalConv1dDetSavedSet,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
    make_plan,
)
from cake_causal_conv1d_det_train.api import WEIGHT_LAYOUT, X_LAYOUT, adopt_workspace_plan
from cake_causal_conv1d_det_train.plan import MAX_HIDDEN, MAX_KERNEL_SIZE, MIN_KERNEL_SIZE
from cake_core import (
    Mode,
    check_dtype,
    check_flag,
    check_last_dim_contiguous,
    check_ndim,
    check_same_device,
    check_shape,
    check_tensor,
    require_mode,
)
from cake_core.autograd import once_differentiable
from cake_core.kcp import Context, agree_once
from cake_core.triton_utils import launch_device_check

from cake_causal_conv1d_det_train_kcp.context import (
    bwd_payload_bytes,
    check_context,
    device_halo,
    fwd_payload_bytes,
)
from cake_causal_conv1d_det_train_kcp.exchange import (
    add_in_rounds,
    all_gather_bytes,
    rank_order_sum,
)
from cake_causal_conv1d_det_train_kcp.saved import (
    CausalConv1dDetKCPSavedSet,
    CausalConv1dDetKCPWorkspace,
)

__all__ = [
    "CausalConv1dDetKCPGrads",
    "causal_conv1d_det_bwd_kcp",
    "causal_conv1d_det_fwd_kcp",
    "causal_conv1d_det_kcp",
]

_F32 = torch.float32
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: activation name -> the local package's (FLA accepts "swish" as an alias of "silu")
_ACTIVATIONS = {None: None, "silu": "silu", "swish": "silu"}


class CausalConv1dDetKCPGrads(NamedTuple):
    """Gradients of :func:`causal_conv1d_det_bwd_kcp`.

    dx: ``[1, T_r, D]`` in x's dtype (contiguous), rank-local, including the gradients
    that later fragments' halos (on any rank) sent back. dweight: ``[D, W]`` in weight's
    dtype; dbias: ``[D]`` in bias's dtype, or ``None`` without a bias. Without
    ``reduce_weight_grads`` they are this rank's share (the sum over its own outputs);
    with it, the sum of every rank's share in rank order, the same bits on every rank.
    """

    dx: torch.Tensor
    dweight: torch.Tensor
    dbias: torch.Tensor | None


# ----------------------------------------------------------------------------- checks


def _activation(activation) -> str | None:
    if not (activation is None or isinstance(activation, str)) or \
            activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    return _ACTIVATIONS[activation]


_DEFAULT_PLANS: dict[tuple, CausalConv1dDetPlan] = {}


def _resolve_plan(plan, D: int, W: int, dtype: torch.dtype,
                  device: torch.device, workspace=None) -> CausalConv1dDetPlan:
    """``plan``; else the rule's packed plan (cached), or the workspace's plan where that
    differs from it in the forward's fields only (``adopt_workspace_plan``)."""
    if plan is None:
        key = (D, W, dtype, device)
        got = _DEFAULT_PLANS.get(key)
        if got is None:
            # each rank's shard runs as packed documents: the rule's packed plan
            got = _DEFAULT_PLANS[key] = make_plan(D, W, dtype, device, varlen=True)
        return adopt_workspace_plan(got, workspace) if workspace is not None else got
    require_mode(plan, CausalConv1dDetPlan, Mode.DET, name="plan")
    if (plan.hidden_size, plan.kernel_size) != (D, W):
        raise ValueError(f"plan: made for hidden_size={plan.hidden_size}, "
                         f"kernel_size={plan.kernel_size}; inputs have D={D}, W={W}")
    return plan


def _resolve_workspace(workspace, plan: CausalConv1dDetPlan, ctx: Context,
                       dtype: torch.dtype) -> CausalConv1dDetKCPWorkspace | None:
    if workspace is None:
        return None
    require_mode(workspace, CausalConv1dDetKCPWorkspace, Mode.DET, name="workspace")
    workspace.check_for(plan, ctx, dtype)
    return workspace


def local_fwd_checks(x, weight, bias, ctx, activation, plan, workspace,
                     reduce_weight_grads=False):
    """The forward's checks on this rank alone (no allocation, launch or collective: what
    ``is_supported`` runs), ``reduce_weight_grads`` the autograd entry's flag (the
    low-level forward passes the default); returns ``(activation, plan, workspace)``."""
    check_context(ctx)
    check_tensor(x, "x")
    check_ndim(x, "x", ndim=3, layout=X_LAYOUT)
    check_dtype(x, "x", _FLOATS)
    B, T, D = x.shape
    if B != 1:
        raise ValueError(f"x: expected the rank-local [1, T_r, D] (this rank's fragments, "
                         f"packed), got batch size {B}")
    if not 1 <= D <= MAX_HIDDEN:
        raise ValueError(f"x: channels D (last dim) must be in [1, {MAX_HIDDEN}], got {D}")
    check_last_dim_contiguous(x, "x")
    ctx.check_num_tokens(x, "x")
    check_tensor(weight, "weight")
    if weight.dim() != 2 or weight.shape[0] != D:
        raise ValueError(f"weight: expected shape [{D}, W] ({WEIGHT_LAYOUT}), got "
                         f"{list(weight.shape)}")
    W = weight.shape[1]
    if not MIN_KERNEL_SIZE <= W <= MAX_KERNEL_SIZE:
        raise ValueError(f"weight: kernel size W must be in [{MIN_KERNEL_SIZE}, "
                         f"{MAX_KERNEL_SIZE}], got {W}")
    check_dtype(weight, "weight", tuple(dict.fromkeys((_F32, x.dtype))))
    check_last_dim_contiguous(weight, "weight")
    if ctx.conv_kernel_size != W:
        raise ValueError(f"ctx: built with conv_kernel_size={ctx.conv_kernel_size}, but weight "
                         f"has W={W} taps; build the context with conv_kernel_size={W}")
    if bias is not None:
        check_tensor(bias, "bias")
        check_shape(bias, "bias", [D])
        check_dtype(bias, "bias", tuple(dict.fromkeys((_F32, x.dtype))))
        check_last_dim_contiguous(bias, "bias")
    act = _activation(activation)
    device = check_same_device(("x", x), ("weight", weight), ("bias", bias))
    launch_device_check(device, "x")
    check_context(ctx, device)
    plan = _resolve_plan(plan, D, W, x.dtype, device, workspace)
    workspace = _resolve_workspace(workspace, plan, ctx, x.dtype)
    check_flag(reduce_weight_grads, "reduce_weight_grads")
    return act, plan, workspace


def _check_fwd(x, weight, bias, ctx, activation, plan, workspace, reduce_weight_grads=False):
    """Every check of the forward, before any allocation, launch or collective: the local
    ones (:func:`local_fwd_checks`), then the ranks' agreement; returns ``(activation,
    plan, workspace)``."""
    act, plan, workspace = local_fwd_checks(x, weight, bias, ctx, activation, plan, workspace,
                                            reduce_weight_grads)
    D, W = x.shape[2], weight.shape[1]
    # the last check, the first collective: the ranks compare what their collectives use
    agree_once(ctx, "causal_conv1d_fwd_kcp", D=D, W=W, dtype=x.dtype, bias=bias is not None,
               weight_dtype=weight.dtype, activation=act, plan=plan)
    return act, plan, workspace


def _check_bwd(dy, saved, ctx, reduce_weight_grads, plan, workspace):
    """Every check of the backward, before any allocation, launch or collective; returns
    ``(plan, workspace)``."""
    require_mode(saved, CausalConv1dDetKCPSavedSet, Mode.DET, name="saved")
    if saved.local is not None:
        require_mode(saved.local, CausalConv1dDetSavedSet, Mode.DET, name="saved.local")
    check_context(ctx)
    made = (saved.partition_key, saved.rank, saved.kernel_size)
    if made != (ctx.partition.key, ctx.rank, ctx.conv_kernel_size):
        raise ValueError(f"saved: made on (partition, rank, kernel size) = {made}, but ctx is "
                         f"{(ctx.partition.key, ctx.rank, ctx.conv_kernel_size)}")
    check_flag(reduce_weight_grads, "reduce_weight_grads")
    x = saved.x
    check_tensor(dy, "dy")
    check_shape(dy, "dy", list(x.shape), layout=X_LAYOUT)
    check_dtype(dy, "dy", _FLOATS)
    check_last_dim_contiguous(dy, "dy")
    device = check_same_device(("saved", x), ("dy", dy))
    launch_device_check(device, "dy")
    check_context(ctx, device)
    D, W = x.shape[2], saved.weight.shape[1]
    if plan is None:  # the forward's, or the workspace's where it differs in forward fields
        plan = adopt_workspace_plan(saved.plan, workspace) \
            if isinstance(saved.plan, CausalConv1dDetPlan) else saved.plan
    plan = _resolve_plan(plan, D, W, x.dtype, device)
    workspace = _resolve_workspace(workspace, plan, ctx, x.dtype)
    agree_once(ctx, "causal_conv1d_bwd_kcp", D=D, W=W, dtype=x.dtype,
               reduce_weight_grads=bool(reduce_weight_grads), plan=plan)
    return plan, workspace


# ----------------------------------------------------------------------------- work


def _bytes(ws, name: str, n: int, device, rows: int | None = None) -> torch.Tensor:
    """A uint8 buffer of ``n`` bytes (``[rows, n]`` for a receive buffer): the
    workspace's, or a new one."""
    if ws is not None:
        return ws.bytes_view(name, n)
    shape = (n,) if rows is None else (rows, n)
    return torch.empty(shape, dtype=torch.uint8, device=device)


def _forward(x, weight, bias, ctx: Context, act, plan, ws):
    """After :func:`_check_fwd`: ``(y, saved)``."""
    dh = device_halo(ctx)
    hp, rh = dh.plan, dh.rank
    D, W = x.shape[2], weight.shape[1]
    dev = x.device
    w_local = weight if weight.dtype == _F32 else weight.float()
    b_local = bias if bias is None or bias.dtype == _F32 else bias.float()
    with torch.no_grad():
        gathered = None
        nbytes = fwd_payload_bytes(hp, D, x.element_size())
        if nbytes:  # some halo row crosses a rank: every rank joins
            send = _bytes(ws, "fwd_send", nbytes, dev)
            recv = _bytes(ws, "fwd_recv", nbytes, dev, ctx.world_size)
            rows = send.view(x.dtype).view(hp.fwd_rows_per_rank, D)
            n = len(rh.send_rows)
            if n:
                rows[:n] = x[0].index_select(0, dh.send_rows)
            rows[n:].zero_()
            all_gather_bytes(send, recv, ctx)
            gathered = recv.view(x.dtype).view(ctx.world_size * hp.fwd_rows_per_rank, D)
        h0 = None
        if rh.has_halo:
            slots = torch.zeros((rh.n_slots, D), dtype=x.dtype, device=dev)
            if dh.self_dst.numel():
                slots[dh.self_dst] = x[0].index_select(0, dh.self_src)
            if dh.recv_dst.numel():
                slots[dh.recv_dst] = gathered.index_select(0, dh.recv_src)
            # [n_frag, D, W - 1] with slot k = the input W - 1 - k before the fragment
            h0 = slots.view(rh.num_fragments, W - 1, D).transpose(1, 2)
        if ctx.num_tokens:
            y, _, local = causal_conv1d_det_fwd(x, w_local, b_local, activation=act,
                                                cu_seqlens=ctx.cu_seqlens, initial_state=h0,
                                                plan=plan)
        else:  # no token: no kernel
            y, local = torch.empty((1, 0, D), dtype=x.dtype, device=dev), None
    meta = {"partition_key": ctx.partition.key, "rank": ctx.rank,
            "world_size": ctx.world_size, "num_tokens": ctx.num_tokens, "kernel_size": W,
            "activation": act, "plan": plan}
    saved = CausalConv1dDetKCPSavedSet(Mode.DET, {"x": x, "weight": weight, "bias": bias},
                                       meta, local)
    return y, saved


def _backward(dy, saved: CausalConv1dDetKCPSavedSet, ctx: Context, reduce: bool, plan,
              ws) -> CausalConv1dDetKCPGrads:
    """After :func:`_check_bwd`."""
    dh = device_halo(ctx)
    hp, rh = dh.plan, dh.rank
    x, weight, bias = saved.x, saved.weight, saved.bias
    D, W = x.shape[2], weight.shape[1]
    dev = x.device
    with torch.no_grad():
        if saved.local is not None:
            gr = causal_conv1d_det_bwd(dy, None, saved.local, plan=plan,
                                       workspace=ws.local if ws is not None else None)
            dx, dw, db, dslots = gr.dx, gr.dweight, gr.dbias, gr.dinitial_state
        else:  # no token: a zero share, no kernel
            dx = torch.empty((1, 0, D), dtype=x.dtype, device=dev)
            dw = torch.zeros((D, W), dtype=_F32, device=dev)
            db = torch.zeros((D,), dtype=_F32, device=dev) if bias is not None else None
            dslots = None
        # halo slot gradients, token-major [n_slots, D]
        slot_grads = (dslots.transpose(1, 2).reshape(rh.n_slots, D) if dslots is not None
                      else x.new_empty((0, D)))
        nw = (D * W + (D if bias is not None else 0)) if reduce else 0
        nbytes = bwd_payload_bytes(hp, D, x.element_size(), nw)
        received = x.new_empty((0, D))
        if nbytes:  # halo gradients to return or shares to reduce: every rank joins
            send = _bytes(ws, "bwd_send", nbytes, dev)
            recv = _bytes(ws, "bwd_recv", nbytes, dev, ctx.world_size)
            send.zero_()
            if nw:
                vals = send[:4 * nw].view(_F32)
                vals[:D * W] = dw.reshape(-1)
                if bias is not None:
                    vals[D * W:] = db
            s_b = hp.bwd_rows_per_rank
            hb = s_b * D * x.element_size()
            if s_b and len(rh.publish):
                rows = send[4 * nw:4 * nw + hb].view(x.dtype).view(s_b, D)
                rows[:len(rh.publish)] = slot_grads.index_select(0, dh.publish)
            all_gather_bytes(send, recv, ctx)
            if nw:
                total = rank_order_sum(recv[:, :4 * nw].view(_F32))
                dw = total[:D * W].view(D, W).clone()
                db = total[D * W:].clone() if bias is not None else None
            if s_b:
                received = recv[:, 4 * nw:4 * nw + hb].view(x.dtype).reshape(
                    ctx.world_size * s_b, D)
        if dh.touched.numel():
            add_in_rounds(dx, dh.touched, dh.rounds, torch.cat([slot_grads, received]))
        dweight = dw.to(weight.dtype)
        dbias = db.to(bias.dtype) if bias is not None else None
    return CausalConv1dDetKCPGrads(dx, dweight, dbias)


# ----------------------------------------------------------------------------- public API


def causal_conv1d_det_fwd_kcp(x: torch.Tensor, weight: torch.Tensor,
                              bias: torch.Tensor | None, ctx: Context, *,
                              activation: str | None = None,
                              plan: CausalConv1dDetPlan | None = None,
                              workspace: CausalConv1dDetKCPWorkspace | None = None):
    """Context-parallel det causal depthwise conv1d forward on one rank, without autograd.

    The single-rank package's semantics (Dao-AILab ``causal_conv1d_fn`` / FLA
    ``ShortConvolution``, token-major) over the documents of ``ctx.partition``, from zero
    inputs before each document start, each rank computing its own tokens:
    ``y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c])``. The ``W - 1``
    rows before each continuing fragment (its halo) come from the ranks that hold them, by
    one all-gather. Every rank of ``ctx.group`` must call it (the same number of times, in
    the same order, with the same D, W, dtype and options): a rank holding no token runs no
    kernel but takes part in every collective. No ``initial_state`` / ``final_state`` on
    this route (as in FLA's context parallelism).

    Args:
        x: rank-local ``[1, T_r, D]`` (``T_r = ctx.num_tokens``: this rank's fragments in
            ``ctx`` order; shard a global ``[1, T, D]`` with ``x[:, partition.global_index(
            r)]``), fp32, bf16 or fp16, channels contiguous (stride 1), any time stride;
            ``1 <= D <= 2**20``; ``T_r = 0`` allowed.
        weight: ``[D, W]``, ``2 <= W <= 8`` (``W`` must equal ``ctx.conv_kernel_size``), fp32
            or x's dtype, last dim contiguous; the same on every rank.
        bias: ``[D]`` (fp32 or x's dtype) or ``None``.
        ctx: this rank's :class:`cake_core.kcp.Context` (:func:`build_context_det_kcp` with
            ``conv_kernel_size=W``).
        activation: ``None``, ``"silu"`` or ``"swish"`` (an alias of silu).
        plan: a :class:`cake_causal_conv1d_det_train.CausalConv1dDetPlan` for (D, W)
            (default ``make_plan(D, W, x.dtype, device, varlen=True)``).
        workspace: a :class:`CausalConv1dDetKCPWorkspace` from ``for_context(plan, ctx,
            dtype=x.dtype)`` (default: buffers allocated per call).

    Returns:
        ``(y, saved)``: y ``[1, T_r, D]`` contiguous in x's dtype (fp32 accumulation);
        saved a :class:`CausalConv1dDetKCPSavedSet` for :func:`causal_conv1d_det_bwd_kcp`.

    Determinism: for a fixed partition and plan, y repeats bitwise on every rank, run after
    run (exact halo copies, the single-rank det kernels). Across partitions results agree
    within float tolerance, not bitwise (a continuing fragment adds its halo taps after
    its own, ``docs/kcp.md``); a partition in which no document crosses a fragment (world
    size 1 with a layout) is bitwise the single-rank package.

    Raises:
        ValueError: ``ctx`` not a Context, made for another rank, world size, device or
            kernel size; x not ``[1, ctx.num_tokens, D]``, wrong dtype, non-contiguous
            channels; weight / bias of the wrong shape, dtype or layout; tensors on
            different devices; an unknown activation; a foreign plan or workspace (type,
            mode, shape, partition, rank or dtype); all before any allocation, launch or
            collective, and nothing the caller passed is modified.
    """
    act, plan, ws = _check_fwd(x, weight, bias, ctx, activation, plan, workspace)
    return _forward(x, weight, bias, ctx, act, plan, ws)


def causal_conv1d_det_bwd_kcp(dy: torch.Tensor, saved: CausalConv1dDetKCPSavedSet,
                              ctx: Context, *, reduce_weight_grads: bool = False,
                              plan: CausalConv1dDetPlan | None = None,
                              workspace: CausalConv1dDetKCPWorkspace | None = None
                              ) -> CausalConv1dDetKCPGrads:
    """Backward of :func:`causal_conv1d_det_fwd_kcp` on one rank (every rank must call it,
    with the same ``reduce_weight_grads``).

    The single-rank backward over this rank's fragments (pre-activation recomputed, dweight
    / dbias as fp32 partials per token block summed in index order, no atomics) gives dx,
    this rank's dweight / dbias share and the halo gradients; one all-gather returns each
    halo row's gradient to the rank that holds the row (where it is added to dx in fp32,
    in document order after the local gradient) and, with ``reduce_weight_grads``, carries
    every rank's fp32 share, summed in rank order on every rank.

    Args:
        dy: gradient of y, rank-local ``[1, T_r, D]``, fp32/bf16/fp16, channels contiguous.
        saved: the :class:`CausalConv1dDetKCPSavedSet` of the forward on this ``ctx``.
        ctx: the forward's context.
        reduce_weight_grads: ``False``: dweight / dbias are this rank's share (the sum over
            its own outputs; the shares of all ranks add up to the full gradient). ``True``:
            the shares of every rank summed in rank order in fp32 (one all-gather, never an
            all-reduce), the same bits on every rank.
        plan: default: the forward's. workspace: as in :func:`causal_conv1d_det_fwd_kcp`.

    Returns:
        :class:`CausalConv1dDetKCPGrads` ``(dx, dweight, dbias)``: dx like x, dweight in
        weight's dtype, dbias in bias's dtype or ``None``.

    Raises:
        ValueError: a saved set or workspace that is not this package's det type (the
            single-rank package's, a non-det one), a saved set from another context
            (partition, rank or kernel size), dy of the wrong shape, dtype, layout or device,
            a non-bool ``reduce_weight_grads``, a foreign plan; all before any allocation,
            launch or collective.
    """
    plan, ws = _check_bwd(dy, saved, ctx, reduce_weight_grads, plan, workspace)
    return _backward(dy, saved, ctx, reduce_weight_grads, plan, ws)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


class _CausalConv1dDetKCPFunction(torch.autograd.Function):
    """Autograd of the KCP route: the saved set's tensors (own and nested) go through
    ``ctx.save_for_backward``; the KCP context, plan and workspace are kept as attributes."""

    @staticmethod
    def forward(actx, x, weight, bias, kcp_ctx, act, reduce, plan, ws):
        y, saved = _forward(x, weight, bias, kcp_ctx, act, plan, ws)
        actx.save_for_backward(*saved.tensors())
        actx.meta, actx.kcp_ctx, actx.reduce = saved.meta, kcp_ctx, reduce
        actx.plan, actx.ws = plan, ws
        return y

    @staticmethod
    @once_differentiable
    def backward(actx, dy):
        saved = CausalConv1dDetKCPSavedSet.from_tensors(Mode.DET, actx.saved_tensors,
                                                        actx.meta)
        x = saved.x
        if dy is None:
            dy = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        g = _backward(_last_dim_contiguous(dy), saved, actx.kcp_ctx, actx.reduce, actx.plan,
                      actx.ws)
        return g.dx, g.dweight, g.dbias, None, None, None, None, None


@torch.compiler.disable
def causal_conv1d_det_kcp(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          ctx: Context, *, activation: str | None = None,
                          reduce_weight_grads: bool = False,
                          plan: CausalConv1dDetPlan | None = None,
                          workspace: CausalConv1dDetKCPWorkspace | None = None
                          ) -> torch.Tensor:
    """Context-parallel det causal depthwise conv1d with autograd; returns rank-local ``y``
    ``[1, T_r, D]``.

    Arguments, semantics and errors as :func:`causal_conv1d_det_fwd_kcp`; gradients flow to
    x, weight and bias through :func:`causal_conv1d_det_bwd_kcp`'s algorithm, with
    ``reduce_weight_grads`` as there (``False``: weight.grad / bias.grad receive this rank's
    share, to be reduced by the trainer; ``True``: the rank-order sum of all shares, the
    same bits on every rank). Every rank must run the forward and the backward
    (collectives inside): a rank without tokens must still call ``backward`` through its
    empty output (e.g. include ``y.sum()`` in its loss). Not twice differentiable.
    ``torch.compile`` does not trace it (it runs eagerly, a graph break).

    Raises:
        ValueError: as :func:`causal_conv1d_det_fwd_kcp`, and a non-bool
            ``reduce_weight_grads``; before any allocation, launch or collective.
    """
    act, plan, ws = _check_fwd(x, weight, bias, ctx, activation, plan, workspace,
                               reduce_weight_grads)
    return _CausalConv1dDetKCPFunction.apply(x, weight, bias, ctx, act, reduce_weight_grads,
                                             plan, ws)
