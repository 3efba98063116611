"""RMSNormNondetSavedSet and RMSNormNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace, require_mode
from cake_core.checks import check_alloc_device
from cake_rmsnorm_det_train.saved import workspace_specs

from cake_rmsnorm_nondet_train.plan import RMSNormNondetPlan


class RMSNormNondetSavedSet(SavedSet):
    """What :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet_fwd` keeps for
    :func:`~cake_rmsnorm_nondet_train.rmsnorm_nondet_bwd` (mode ``nondet``): the tensors
    and meta of cake-rmsnorm-det-train's ``RMSNormDetSavedSet``; a det backward refuses it
    and this package refuses the det one.

    Tensors:
        xh: ``[..., H]``, the normalized input: x, or h = x + residual when a residual
            was given (x's dtype).
        weight: ``[H]``.
        rstd: ``[rows]`` fp32, 1 / sqrt(mean(xh**2) + eps) per row.
    Meta: ``has_residual`` (bool), ``plan`` (the forward's RMSNormNondetPlan).
    """

    tensor_names = ("xh", "weight", "rstd")
    format_version = 1


class RMSNormNondetWorkspace(Workspace):
    """fp32 partial-dweight rows ``[plan.bwd_programs, plan.hidden_size]`` for one
    :class:`RMSNormNondetPlan` (mode ``nondet``).

    Build with :meth:`for_plan`. Reusing one workspace across steps avoids an allocation
    per backward; its contents are overwritten each call (no state carries over).
    """

    @classmethod
    def for_plan(cls, plan: RMSNormNondetPlan,
                 device: torch.device | str) -> RMSNormNondetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` is not an RMSNormNondetPlan (e.g. a det plan).
        """
        device = check_alloc_device(device)
        buffers = {name: torch.empty(shape, dtype=dtype, device=device)
                   for name, (shape, dtype) in cls._buffer_specs(plan).items()}
        return cls(plan, device, buffers)

    @classmethod
    def _buffer_specs(cls, plan: RMSNormNondetPlan
                      ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{name: (shape, dtype)}`` of what :meth:`for_plan` allocates for ``plan``
        (what ``workspace_bytes_nondet`` sums); ``ValueError`` for another plan type or mode."""
        require_mode(plan, RMSNormNondetPlan, Mode.NONDET, name="plan")
        return workspace_specs(plan)


__all__ = ["Mode", "RMSNormNondetSavedSet", "RMSNormNondetWorkspace"]
