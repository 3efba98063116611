"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of the det MoE grouped GEMM entry (``cake_core.support``).

They answer for :func:`~cake_moe_grouped_det_gemm.moe_grouped_det_gemm`; the
``MoEFeedForward`` layer (routing, permutation, three grouped GEMMs) has no queries yet.
"""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_moe_grouped_det_gemm.api import _checks
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


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
