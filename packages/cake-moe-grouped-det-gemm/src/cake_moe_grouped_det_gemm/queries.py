"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of the det MoE grouped GEMM entry (``cake_core.support``).

They answer for :func:`~cake_moe_grouped_det_gemm.moe_grouped_det_gemm`;
:func:`moe_feed_forward_is_supported` and :func:`moe_feed_forward_saved_bytes` for the
layer, :func:`~cake_moe_grouped_det_gemm.moe_feed_forward_det` (and
:class:`~cake_moe_grouped_det_gemm.MoEFeedForward`'s forward). The layer takes no workspace
(its grouped GEMMs allocate their scratch per call), so it has no ``workspace_bytes``.
"""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_moe_grouped_det_gemm.api import _checks
from cake_moe_grouped_det_gemm.moe import MoEFeedForwardPlans, _check_layer
from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan
from cake_moe_grouped_det_gemm.saved import MoEGroupedDetWorkspace, workspace_buffers


def is_supported(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor | None = None, *,
                 m_sizes: torch.Tensor | None = None, plan: MoEGroupedDetPlan | None = None,
                 workspace: MoEGroupedDetWorkspace | None = None,
                 main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_moe_grouped_det_gemm.moe_grouped_det_gemm` serves this call,
    with its own arguments: ``Support(True, "")``, or ``Support(False, reason)`` with the
    message of the ``ValueError`` the entry would raise. Runs the entry's checks only (no
    allocation, no kernel launch; like the entry it reads CPU ``offs`` / ``m_sizes`` values,
    never device ones); never raises ``ValueError``.

    Example::

        is_supported(torch.randn(6, 16), torch.randn(2, 8, 16),
                     torch.tensor([4, 6], dtype=torch.int32)).ok   # True
    """
    return support_of(lambda: _checks(x, weight, offs, m_sizes, plan, workspace, main_grad))


def workspace_bytes(plan: MoEGroupedDetPlan, device: torch.device | str | None = None) -> int:
    """Bytes ``MoEGroupedDetWorkspace.for_plan(plan, device)`` allocates (fp32
    ``[S, E, N, K]``, S = ``plan.wgrad_splits``; 0 when S = 1), computed without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a det
            :class:`MoEGroupedDetPlan`.

    Example::

        workspace_bytes(make_plan(4096, 8, 512, 1024, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan).values())


def saved_bytes(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor | None = None, *,
                m_sizes: torch.Tensor | None = None, plan: MoEGroupedDetPlan | None = None,
                workspace: MoEGroupedDetWorkspace | None = None,
                main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_moe_grouped_det_gemm.moe_grouped_det_gemm`
    allocates and keeps for the backward, with the entry's own arguments: the int32 row
    ends ``[E]`` (``4 * E``); x and weight are the caller's. Computed from shapes only;
    tensors on the meta device are served (the backend's device check is skipped, the
    others are run).

    Raises:
        ValueError: the entry's, for bad arguments.

    Example::

        saved_bytes(torch.empty(6, 16, device="meta"), torch.empty(2, 8, 16, device="meta"),
                    torch.empty(2, dtype=torch.int32, device="meta"))   # 8
    """
    _checks(x, weight, offs, m_sizes, plan, workspace, main_grad, launch=False)
    return nbytes_of([((weight.shape[0],), torch.int32)])


def moe_feed_forward_is_supported(x: torch.Tensor, router_weight: torch.Tensor,
                                  w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int,
                                  *, normalize_topk: bool = True, aux_loss_coef: float = 0.01,
                                  plans: MoEFeedForwardPlans | None = None) -> Support:
    """Whether :func:`~cake_moe_grouped_det_gemm.moe_feed_forward_det` serves this call
    (its own arguments; for a :class:`~cake_moe_grouped_det_gemm.MoEFeedForward` ``m``:
    ``(x, m.router_weight, m.w_gate_up, m.w_down, m.top_k,
    normalize_topk=m.normalize_topk, aux_loss_coef=m.aux_loss_coef)``): ``Support(True,
    "")``, or ``Support(False, reason)`` with the message of the ``ValueError`` the layer
    would raise. Runs the layer's checks only (no allocation, no launch, no sync); never
    raises ``ValueError``.

    Example::

        moe_feed_forward_is_supported(torch.randn(6, 16), torch.randn(4, 16),
                                      torch.randn(4, 16, 16), torch.randn(4, 16, 8), 2).ok
    """
    return support_of(lambda: _check_layer(x, router_weight, w_gate_up, w_down, top_k,
                                           normalize_topk, aux_loss_coef, plans))


def moe_feed_forward_saved_bytes(x: torch.Tensor, router_weight: torch.Tensor,
                                 w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int,
                                 *, normalize_topk: bool = True, aux_loss_coef: float = 0.01,
                                 plans: MoEFeedForwardPlans | None = None) -> int:
    """Bytes the forward of :func:`~cake_moe_grouped_det_gemm.moe_feed_forward_det` (its
    own arguments) allocates and its autograd graph keeps for the backward, when the
    layer's weights require grad (training), computed from shapes and dtypes without
    running anything. With T tokens, R = T·k rows, E experts, ``b`` x's element size:
    in x's dtype the permuted rows ``[R, d_model]``, the gate/up output ``[R, 2·d_ff]``,
    the SwiGLU's product ``[R, d_ff]``, the expert outputs ``[R, d_model]``; in fp32 the
    router probabilities ``[T, E]``, the top-k weights ``[T, k]`` (and, with
    ``normalize_topk``, their sums before the division ``[T]``), the
    fp32 copies the router GEMM reads (x ``[T, d_model]`` unless x is fp32 and reshapes to
    ``[T, d_model]`` as a view; router_weight ``[E, d_model]`` unless fp32), the expert
    fractions ``[E]`` when ``aux_loss_coef > 0``; int64 ids ``[T, k]`` and slot ``[R]``
    (assignment -> sorted row); the grouped GEMMs' int32 row ends (``1 + E``: the router's
    one group, and the routing's offsets, which both expert GEMMs read as their ends). The
    caller's tensors are not counted. Meta tensors are served (the backend's device check
    is skipped).

    Raises:
        ValueError: the layer's, for bad arguments.

    Example::

        moe_feed_forward_saved_bytes(torch.empty(4096, 1024, device="meta"),
                                     torch.empty(8, 1024, device="meta"),
                                     torch.empty(8, 1024, 1024, device="meta"),
                                     torch.empty(8, 1024, 512, device="meta"), 2)
    """
    return feed_forward_saved_bytes_for(MoEFeedForwardPlans, None, x, router_weight,
                                        w_gate_up, w_down, top_k, normalize_topk,
                                        aux_loss_coef, plans)


def feed_forward_saved_bytes_for(plans_cls, resolve, x, router_weight, w_gate_up, w_down,
                                 top_k, normalize_topk, aux_loss_coef, plans) -> int:
    """:func:`moe_feed_forward_saved_bytes` with the plans type and plan check of a mode
    (the nondet sibling passes its own; its layer keeps the same tensors)."""
    T, E, d, f, k, coef, _, _ = _check_layer(x, router_weight, w_gate_up, w_down, top_k,
                                             normalize_topk, aux_loss_coef, plans, plans_cls,
                                             resolve, launch=False)
    R, f32, i64, dt = T * k, torch.float32, torch.int64, x.dtype
    shapes = [((R, d), dt), ((R, 2 * f), dt), ((R, f), dt), ((R, d), dt),
              ((T, E), f32), ((T, k), f32), ((T, k), i64), ((R,), i64),
              ((1 + E,), torch.int32)]
    if normalize_topk:  # the gate's backward reads the sums it divided by
        shapes.append(((T,), f32))
    view = torch.empty_strided(x.shape, x.stride(), dtype=dt, device="meta").reshape(T, d)
    if dt != f32 or not view._is_view():  # the router GEMM's fp32 x
        shapes.append(((T, d), f32))
    if router_weight.dtype != f32:
        shapes.append(((E, d), f32))
    if coef > 0.0:  # the aux loss keeps the expert fractions
        shapes.append(((E,), f32))
    return nbytes_of(shapes)


__all__ = ["is_supported", "moe_feed_forward_is_supported", "moe_feed_forward_saved_bytes",
           "saved_bytes", "workspace_bytes"]
