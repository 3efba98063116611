"""RMSNormDetSavedSet and RMSNormDetWorkspace (modes checked through cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_rmsnorm_det_train.plan import RMSNormDetPlan


class RMSNormDetSavedSet(SavedSet):
    """What the det forward keeps for the backward.

    Tensors:
        xh: ``[..., H]``, the normalized input: x, or h = x + residual when a residual
            was given (x's dtype).
        weight: ``[H]``.
        rstd: ``[rows]`` fp32, 1 / sqrt(mean(xh**2) + eps) per row.
    Meta: ``has_residual`` (bool), ``plan`` (the forward's RMSNormDetPlan), ``offset``
    (float, the forward's weight offset; absent means 0).
    """

    tensor_names = ("xh", "weight", "rstd")
    format_version = 1


class RMSNormDetWorkspace(Workspace):
    """fp32 partial-dweight rows ``[plan.bwd_programs, plan.hidden_size]`` for one plan.

    Build with :meth:`for_plan`. Reusing one workspace across steps avoids an allocation
    per backward; its contents are overwritten each call (no state carries over).
    """

    @classmethod
    def for_plan(cls, plan: RMSNormDetPlan, device: torch.device | str) -> RMSNormDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``."""
        device = check_alloc_device(device)
        buffers = {name: torch.empty(shape, dtype=dtype, device=device)
                   for name, (shape, dtype) in cls._buffer_specs(plan).items()}
        return cls(plan, device, buffers)

    @classmethod
    def _buffer_specs(cls, plan: RMSNormDetPlan) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{name: (shape, dtype)}`` of what :meth:`for_plan` allocates for ``plan``
        (what ``workspace_bytes`` sums); ``ValueError`` for a plan of another type."""
        if not isinstance(plan, RMSNormDetPlan):
            raise ValueError(f"plan: expected RMSNormDetPlan, got {type(plan).__name__}")
        return workspace_specs(plan)


def workspace_specs(plan) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The workspace's one buffer for a plan with this package's fields (the nondet
    sibling's workspace has the same): fp32 partials ``[bwd_programs, hidden_size]``."""
    return {"partials": ((plan.bwd_programs, plan.hidden_size), torch.float32)}


__all__ = ["Mode", "RMSNormDetSavedSet", "RMSNormDetWorkspace"]
