"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet` and
:func:`saved_bytes_nondet` of the nondet MoE grouped GEMM entry (``cake_core.support``):
the det package's queries with this package's plan and workspace classes;
:func:`moe_feed_forward_is_supported_nondet` and :func:`moe_feed_forward_saved_bytes_nondet`
for the layer, :func:`~cake_moe_grouped_nondet_gemm.moe_feed_forward_nondet` (it takes no
workspace, so it has no ``workspace_bytes``)."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of
from cake_moe_grouped_det_gemm.moe import _check_layer
from cake_moe_grouped_det_gemm.queries import feed_forward_saved_bytes_for
from cake_moe_grouped_det_gemm.saved import workspace_buffers

from cake_moe_grouped_nondet_gemm.api import _nondet_checks, _resolve_nondet_plan
from cake_moe_grouped_nondet_gemm.moe import MoEFeedForwardNondetPlans
from cake_moe_grouped_nondet_gemm.plan import MoEGroupedNondetPlan
from cake_moe_grouped_nondet_gemm.saved import MoEGroupedNondetWorkspace


def is_supported_nondet(x: torch.Tensor, weight: torch.Tensor,
                        offs: torch.Tensor | None = None, *,
                        m_sizes: torch.Tensor | None = None,
                        plan: MoEGroupedNondetPlan | None = None,
                        workspace: MoEGroupedNondetWorkspace | None = None,
                        main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_moe_grouped_nondet_gemm.moe_grouped_nondet_gemm` serves this
    call, with its own arguments: ``Support(True, "")`` or ``Support(False, reason)`` (the
    entry's ``ValueError`` message). Runs the entry's checks only (no allocation, no kernel
    launch); never raises ``ValueError``.

    Example::

        is_supported_nondet(torch.randn(6, 16), torch.randn(2, 8, 16),
                            torch.tensor([4, 6], dtype=torch.int32)).ok   # True
    """
    return support_of(lambda: _nondet_checks(x, weight, offs, m_sizes, plan, workspace,
                                             main_grad))


def workspace_bytes_nondet(plan: MoEGroupedNondetPlan,
                           device: torch.device | str | None = None) -> int:
    """Bytes ``MoEGroupedNondetWorkspace.for_plan(plan, device)`` allocates, computed
    without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a
            :class:`MoEGroupedNondetPlan`.

    Example::

        workspace_bytes_nondet(make_nondet_plan(4096, 8, 512, 1024, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan, plan_cls=MoEGroupedNondetPlan).values())


def saved_bytes_nondet(x: torch.Tensor, weight: torch.Tensor,
                       offs: torch.Tensor | None = None, *,
                       m_sizes: torch.Tensor | None = None,
                       plan: MoEGroupedNondetPlan | None = None,
                       workspace: MoEGroupedNondetWorkspace | None = None,
                       main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_moe_grouped_nondet_gemm.moe_grouped_nondet_gemm`
    allocates and keeps for the backward: the int32 row ends ``[E]`` (``4 * E``). Meta
    tensors are served (the backend's device check is skipped, the others are run).

    Raises:
        ValueError: the entry's, for bad arguments.

    Example::

        saved_bytes_nondet(torch.empty(6, 16, device="meta"),
                           torch.empty(2, 8, 16, device="meta"),
                           torch.empty(2, dtype=torch.int32, device="meta"))   # 8
    """
    _nondet_checks(x, weight, offs, m_sizes, plan, workspace, main_grad, launch=False)
    return nbytes_of([((weight.shape[0],), torch.int32)])


def moe_feed_forward_is_supported_nondet(x: torch.Tensor, router_weight: torch.Tensor,
                                         w_gate_up: torch.Tensor, w_down: torch.Tensor,
                                         top_k: int, *, normalize_topk: bool = True,
                                         aux_loss_coef: float = 0.01,
                                         plans: MoEFeedForwardNondetPlans | None = None
                                         ) -> Support:
    """Whether :func:`~cake_moe_grouped_nondet_gemm.moe_feed_forward_nondet` serves this
    call (its own arguments; a :class:`~cake_moe_grouped_nondet_gemm.MoEFeedForwardNondet`
    ``m`` passes its ``router_weight``, ``w_gate_up``, ``w_down``, ``top_k``,
    ``normalize_topk``, ``aux_loss_coef``): ``Support(True, "")`` or ``Support(False,
    <the layer's ValueError message>)`` (det plans refused). The layer's checks only (no
    allocation, launch or sync); never raises ``ValueError``.

    Example: ``moe_feed_forward_is_supported_nondet(x, router_weight, w_gate_up, w_down,
    2).ok``.
    """
    return support_of(lambda: _check_layer(x, router_weight, w_gate_up, w_down, top_k,
                                           normalize_topk, aux_loss_coef, plans,
                                           MoEFeedForwardNondetPlans, _resolve_nondet_plan))


def moe_feed_forward_saved_bytes_nondet(x: torch.Tensor, router_weight: torch.Tensor,
                                        w_gate_up: torch.Tensor, w_down: torch.Tensor,
                                        top_k: int, *, normalize_topk: bool = True,
                                        aux_loss_coef: float = 0.01,
                                        plans: MoEFeedForwardNondetPlans | None = None) -> int:
    """Bytes the forward of :func:`~cake_moe_grouped_nondet_gemm.moe_feed_forward_nondet`
    (its own arguments) allocates and its autograd graph keeps for the backward when the
    layer's weights require grad, as ``cake_moe_grouped_det_gemm.moe_feed_forward_saved_bytes``
    counts them (the same tensors), from shapes only; meta tensors served.

    Raises:
        ValueError: the layer's, for bad arguments (det plans too).

    Example: ``moe_feed_forward_saved_bytes_nondet(x, router_weight, w_gate_up, w_down,
    2)``.
    """
    return feed_forward_saved_bytes_for(MoEFeedForwardNondetPlans, _resolve_nondet_plan, x,
                                        router_weight, w_gate_up, w_down, top_k,
                                        normalize_topk, aux_loss_coef, plans)


__all__ = ["is_supported_nondet", "moe_feed_forward_is_supported_nondet",
           "moe_feed_forward_saved_bytes_nondet", "saved_bytes_nondet",
           "workspace_bytes_nondet"]
