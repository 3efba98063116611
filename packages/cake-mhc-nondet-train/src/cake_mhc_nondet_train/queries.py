"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet` and
:func:`saved_bytes_nondet` of the nondet mHC layer's prepare (``cake_core.support``): the
det package's queries with this package's plan and workspace classes."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of
from cake_mhc_det_train.queries import _kept_bytes
from cake_mhc_det_train.saved import workspace_buffers

from cake_mhc_nondet_train.api import _nondet_checks
from cake_mhc_nondet_train.plan import MHCNondetPlan
from cake_mhc_nondet_train.saved import MHCNondetWorkspace


def is_supported_nondet(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                        bias: torch.Tensor, *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                        plan: MHCNondetPlan | None = None,
                        workspace: MHCNondetWorkspace | None = None) -> Support:
    """Whether :func:`~cake_mhc_nondet_train.mhc_nondet_prepare` serves this call, with its
    own arguments: ``Support(True, "")`` or ``Support(False, reason)`` (its ``ValueError``
    message). Runs its checks only (no allocation, no launch); never raises ``ValueError``.

    Example::

        n, C = 4, 16
        is_supported_nondet(torch.randn(8, n, C), torch.randn(n * C, 24), torch.ones(3),
                            torch.zeros(24)).ok   # True
    """
    return support_of(lambda: _nondet_checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan,
                                             workspace))


def workspace_bytes_nondet(plan: MHCNondetPlan, device: torch.device | str | None = None
                           ) -> int:
    """Bytes ``MHCNondetWorkspace.for_plan(plan, device)`` allocates, computed without
    allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not an
            :class:`MHCNondetPlan`.

    Example::

        workspace_bytes_nondet(make_nondet_plan(4, 4096, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan, plan_cls=MHCNondetPlan).values())


def saved_bytes_nondet(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor,
                       bias: torch.Tensor, *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                       plan: MHCNondetPlan | None = None,
                       workspace: MHCNondetWorkspace | None = None) -> int:
    """Bytes :func:`~cake_mhc_nondet_train.mhc_nondet_prepare` allocates and keeps for the
    backward: as ``cake_mhc_det_train.saved_bytes`` (fp32 coef, mix, rstd; X's copy when
    its leading dims cannot be flattened as a view). Meta tensors are served.

    Raises:
        ValueError: the prepare's, for bad arguments.

    Example::

        X = torch.empty(16, 4, 16, device="meta")
        saved_bytes_nondet(X, torch.empty(64, 24, device="meta"),
                           torch.empty(3, device="meta"), torch.empty(24, device="meta"))
    """
    _nondet_checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace, launch=False)
    return _kept_bytes(X)


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
