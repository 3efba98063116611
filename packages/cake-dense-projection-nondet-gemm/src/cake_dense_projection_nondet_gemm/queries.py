"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet` and
:func:`saved_bytes_nondet` of the nondet dense projection (``cake_core.support``), the det
package's queries with this package's plan and workspace classes."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of
from cake_dense_projection_det_gemm.saved import workspace_buffers

from cake_dense_projection_nondet_gemm.api import _nondet_checks
from cake_dense_projection_nondet_gemm.plan import DenseProjectionNondetPlan
from cake_dense_projection_nondet_gemm.saved import DenseProjectionNondetWorkspace


def is_supported_nondet(x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None, *,
                        plan: DenseProjectionNondetPlan | None = None,
                        workspace: DenseProjectionNondetWorkspace | None = None,
                        main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_dense_projection_nondet_gemm.dense_projection_nondet` serves
    this call, with its own arguments: ``Support(True, "")`` or ``Support(False, reason)``
    (the entry's ``ValueError`` message). Runs the entry's checks only (no allocation, no
    launch); never raises ``ValueError``.

    Example::

        is_supported_nondet(torch.randn(4, 16), torch.randn(8, 16)).ok   # True
    """
    return support_of(lambda: _nondet_checks(x, weight, bias, plan, workspace, main_grad))


def workspace_bytes_nondet(plan: DenseProjectionNondetPlan,
                           device: torch.device | str | None = None) -> int:
    """Bytes ``DenseProjectionNondetWorkspace.for_plan(plan, device)`` allocates, computed
    without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a
            :class:`DenseProjectionNondetPlan`.

    Example::

        workspace_bytes_nondet(make_nondet_plan(4096, 128, 8192, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan, plan_cls=DenseProjectionNondetPlan).values())


def saved_bytes_nondet(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, *,
                       plan: DenseProjectionNondetPlan | None = None,
                       workspace: DenseProjectionNondetWorkspace | None = None,
                       main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_dense_projection_nondet_gemm.dense_projection_nondet`
    allocates and keeps for the backward: always 0 (it keeps x and weight, the caller's).
    Meta tensors are served (the backend's device check is skipped, the others are run).

    Raises:
        ValueError: the entry's, for bad arguments.

    Example::

        saved_bytes_nondet(torch.empty(4, 16, device="meta"), torch.empty(8, 16, device="meta"))
    """
    _nondet_checks(x, weight, bias, plan, workspace, main_grad, launch=False)
    return 0


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
