"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of the det dense projection (``cake_core.support``)."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_dense_projection_det_gemm.api import _checks
from cake_dense_projection_det_gemm.plan import DenseProjectionDetPlan
from cake_dense_projection_det_gemm.saved import DenseProjectionDetWorkspace, workspace_buffers


def is_supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 plan: DenseProjectionDetPlan | None = None,
                 workspace: DenseProjectionDetWorkspace | None = None,
                 main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_dense_projection_det_gemm.dense_projection_det` serves this call,
    with its own arguments: ``Support(True, "")``, or ``Support(False, reason)`` with the
    message of the ``ValueError`` the entry would raise. Runs the entry's checks only (no
    allocation, no launch); never raises ``ValueError``.

    Example::

        is_supported(torch.randn(4, 16), torch.randn(8, 16)).ok   # True
    """
    return support_of(lambda: _checks(x, weight, bias, plan, workspace, main_grad))


def workspace_bytes(plan: DenseProjectionDetPlan, device: torch.device | str | None = None
                    ) -> int:
    """Bytes ``DenseProjectionDetWorkspace.for_plan(plan, device)`` allocates (fp32
    ``[S, N, K]`` and ``[S, N]``, S = ``plan.wgrad_splits``; 0 when S = 1), computed
    without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a det
            :class:`DenseProjectionDetPlan`.

    Example::

        workspace_bytes(make_plan(4096, 128, 8192, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan).values())


def saved_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                plan: DenseProjectionDetPlan | None = None,
                workspace: DenseProjectionDetWorkspace | None = None,
                main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_dense_projection_det_gemm.dense_projection_det`
    allocates and keeps for the backward, with the entry's own arguments: always 0 (the
    backward reads x and weight, the caller's). Computed from shapes only; tensors on the
    meta device are served (the backend's device check is skipped, the others are run).

    Raises:
        ValueError: the entry's, for bad arguments.

    Example::

        saved_bytes(torch.empty(4, 16, device="meta"), torch.empty(8, 16, device="meta"))  # 0
    """
    _checks(x, weight, bias, plan, workspace, main_grad, launch=False)
    return 0


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
