"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet`,
:func:`saved_bytes_nondet` (cake_core.support's contract), cake-rmsnorm-silu-gate-det-train's
queries run with this package's plans and workspaces."""

from __future__ import annotations

import torch
from cake_core.support import Support
from cake_rmsnorm_silu_gate_det_train.queries import (
    is_supported_for,
    saved_bytes_for,
    workspace_bytes_for,
)

from cake_rmsnorm_silu_gate_nondet_train.api import NONDET_KINDS
from cake_rmsnorm_silu_gate_nondet_train.plan import RMSNormSiluGateNondetPlan
from cake_rmsnorm_silu_gate_nondet_train.saved import RMSNormSiluGateNondetWorkspace


def is_supported_nondet(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                        eps: float = 1e-6, *, norm_before_gate: bool = True,
                        group_size: int | None = None, activation: str = "silu",
                        plan: RMSNormSiluGateNondetPlan | None = None,
                        workspace: RMSNormSiluGateNondetWorkspace | None = None,
                        dweight_accumulator: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet` serves
    this call (its arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the
    message of the ``ValueError`` the entry would raise (e.g. for a det plan). Runs the
    entry's checks only: no allocation or launch; never raises ``ValueError``. Tensors must
    be on the device the kernels run on, as for the entry.

    Example::

        x = torch.randn(8, 64)
        is_supported_nondet(x, x, torch.ones(64)).ok   # True (CPU: interpreter)
    """
    return is_supported_for(NONDET_KINDS, x, z, weight, eps, norm_before_gate, group_size,
                            activation, plan, workspace, dweight_accumulator)


def workspace_bytes_nondet(plan: RMSNormSiluGateNondetPlan,
                           device: torch.device | str | None = None) -> int:
    """Bytes ``RMSNormSiluGateNondetWorkspace.for_plan(plan, device)`` allocates (fp32
    ``[plan.bwd_programs, plan.hidden_size]``), computed without allocating.

    Raises:
        ValueError: ``plan`` is not an RMSNormSiluGateNondetPlan (e.g. a det plan), or a
            bad ``device`` (as ``for_plan``).

    Example::

        workspace_bytes_nondet(make_nondet_plan(4096, torch.bfloat16, "cpu"))
    """
    return workspace_bytes_for(NONDET_KINDS, plan, device)


def saved_bytes_nondet(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6, *, norm_before_gate: bool = True,
                       group_size: int | None = None, activation: str = "silu",
                       plan: RMSNormSiluGateNondetPlan | None = None,
                       workspace: RMSNormSiluGateNondetWorkspace | None = None,
                       dweight_accumulator: torch.Tensor | None = None) -> int:
    """Bytes the forward of
    :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet` allocates and
    keeps for the backward: ``rstd``, fp32 ``[rows, D // G]`` (the caller's x, z and weight
    do not count). Computed from shapes and dtypes; tensors on any device work (meta
    included: the launch-device check is the one check skipped).

    Raises:
        ValueError: any other bad argument, with the entry's message.

    Example::

        x = torch.empty(4096, 2048, device="meta")
        saved_bytes_nondet(x, x, torch.empty(2048, device="meta"))
    """
    return saved_bytes_for(NONDET_KINDS, x, z, weight, eps, norm_before_gate, group_size,
                           activation, plan, workspace, dweight_accumulator)


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
