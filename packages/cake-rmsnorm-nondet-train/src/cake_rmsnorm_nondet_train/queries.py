"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet`,
:func:`saved_bytes_nondet` (cake_core.support's contract), cake-rmsnorm-det-train's queries
run with this package's plans and workspaces."""

from __future__ import annotations

import torch
from cake_core.support import Support
from cake_rmsnorm_det_train.queries import is_supported_for, saved_bytes_for, workspace_bytes_for

from cake_rmsnorm_nondet_train.api import NONDET_KINDS
from cake_rmsnorm_nondet_train.plan import RMSNormNondetPlan
from cake_rmsnorm_nondet_train.saved import RMSNormNondetWorkspace


def is_supported_nondet(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                        offset: float = 0.0,
                        residual: torch.Tensor | None = None,
                        plan: RMSNormNondetPlan | None = None,
                        workspace: RMSNormNondetWorkspace | None = None,
                        dweight_accumulator: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet` serves this call (its
    arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise (e.g. for a det plan). Runs the entry's checks only:
    no allocation or launch; never raises ``ValueError``. Tensors must be on the device the
    kernels run on, as for the entry.

    Example::

        is_supported_nondet(torch.randn(8, 64), torch.ones(64)).ok   # True (CPU: interpreter)
    """
    return is_supported_for(NONDET_KINDS, x, weight, eps, residual, plan, workspace,
                            dweight_accumulator, offset)


def workspace_bytes_nondet(plan: RMSNormNondetPlan,
                           device: torch.device | str | None = None) -> int:
    """Bytes ``RMSNormNondetWorkspace.for_plan(plan, device)`` allocates (fp32
    ``[plan.bwd_programs, plan.hidden_size]``), computed without allocating.

    Raises:
        ValueError: ``plan`` is not an RMSNormNondetPlan (e.g. a det plan), or a bad
            ``device`` (as ``for_plan``).

    Example::

        workspace_bytes_nondet(make_nondet_plan(4096, torch.bfloat16, "cpu"))
    """
    return workspace_bytes_for(NONDET_KINDS, plan, device)


def saved_bytes_nondet(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                       offset: float = 0.0,
                       residual: torch.Tensor | None = None,
                       plan: RMSNormNondetPlan | None = None,
                       workspace: RMSNormNondetWorkspace | None = None,
                       dweight_accumulator: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet` allocates and
    keeps for the backward: ``rstd`` (fp32 per row) and, with a residual, ``h`` (x's shape
    and dtype; also returned); the caller's x and weight do not count. Computed from shapes
    and dtypes; tensors on any device work (meta included: the launch-device check is the
    one check skipped).

    Raises:
        ValueError: any other bad argument, with the entry's message.

    Example::

        saved_bytes_nondet(torch.empty(4096, 2048, device="meta"),
                           torch.empty(2048, device="meta"))
    """
    return saved_bytes_for(NONDET_KINDS, x, weight, eps, residual, plan, workspace,
                           dweight_accumulator, offset)


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
