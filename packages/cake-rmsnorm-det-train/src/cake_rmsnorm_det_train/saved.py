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
    Meta: ``has_residual`` (bool), ``plan`` (the forward's RMSNormDetPlan).
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
        if not isinstance(plan, RMSNormDetPlan):
            raise ValueError(f"plan: expected RMSNormDetPlan, got {type(plan).__name__}")
        partials = torch.empty(plan.bwd_programs, plan.hidden_size, dtype=torch.float32,
                               device=device)
        return cls(plan, device, {"partials": partials})


__all__ = ["Mode", "RMSNormDetSavedSet", "RMSNormDetWorkspace"]
