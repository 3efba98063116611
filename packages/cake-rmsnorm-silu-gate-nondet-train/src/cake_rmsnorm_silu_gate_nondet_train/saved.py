"""RMSNormSiluGateNondetSavedSet and RMSNormSiluGateNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace, require_mode
from cake_core.checks import check_alloc_device
from cake_rmsnorm_silu_gate_det_train.saved import workspace_specs

from cake_rmsnorm_silu_gate_nondet_train.plan import RMSNormSiluGateNondetPlan


class RMSNormSiluGateNondetSavedSet(SavedSet):
    """What :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet_fwd` keeps
    for :func:`~cake_rmsnorm_silu_gate_nondet_train.rmsnorm_silu_gate_nondet_bwd` (mode
    ``nondet``): the tensors and meta of cake-rmsnorm-silu-gate-det-train's
    ``RMSNormSiluGateDetSavedSet``; a det backward refuses it and this package refuses the
    det one.

    Tensors:
        x, z: ``[..., D]`` the inputs as given.
        weight: ``[D]``.
        rstd: ``[rows, D // G]`` fp32, ``1 / sqrt(mean(u**2) + eps)`` per row and group.
    Meta: ``norm_before_gate`` (bool), ``group_size`` (int G), ``eps`` (float),
    ``activation`` (the forward's gate, canonical: ``"silu"`` or ``"sigmoid"``), ``plan``
    (the forward's RMSNormSiluGateNondetPlan).
    """

    tensor_names = ("x", "z", "weight", "rstd")
    format_version = 1


class RMSNormSiluGateNondetWorkspace(Workspace):
    """fp32 partial-dweight rows ``[plan.bwd_programs, plan.hidden_size]`` for one
    :class:`RMSNormSiluGateNondetPlan` (mode ``nondet``).

    Build with :meth:`for_plan`. Reusing one workspace across steps avoids an allocation
    per backward; its contents are overwritten each call (no state carries over).
    """

    @classmethod
    def for_plan(cls, plan: RMSNormSiluGateNondetPlan,
                 device: torch.device | str) -> RMSNormSiluGateNondetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` is not an RMSNormSiluGateNondetPlan (e.g. a det plan).
        """
        device = check_alloc_device(device)
        buffers = {name: torch.empty(shape, dtype=dtype, device=device)
                   for name, (shape, dtype) in cls._buffer_specs(plan).items()}
        return cls(plan, device, buffers)

    @classmethod
    def _buffer_specs(cls, plan: RMSNormSiluGateNondetPlan
                      ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{name: (shape, dtype)}`` of what :meth:`for_plan` allocates for ``plan``
        (what ``workspace_bytes_nondet`` sums); ``ValueError`` for another plan type or mode."""
        require_mode(plan, RMSNormSiluGateNondetPlan, Mode.NONDET, name="plan")
        return workspace_specs(plan)


__all__ = ["Mode", "RMSNormSiluGateNondetSavedSet", "RMSNormSiluGateNondetWorkspace"]
