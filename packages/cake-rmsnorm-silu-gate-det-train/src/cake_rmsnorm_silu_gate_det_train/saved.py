"""RMSNormSiluGateDetSavedSet and RMSNormSiluGateDetWorkspace (modes checked via cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_rmsnorm_silu_gate_det_train.plan import RMSNormSiluGateDetPlan


class RMSNormSiluGateDetSavedSet(SavedSet):
    """What the det forward keeps for the backward.

    Tensors:
        x, z: ``[..., D]`` the inputs as given (x's dtype; the backward recomputes the
            gate and, without ``norm_before_gate``, ``x * gate`` in fp32).
        weight: ``[D]``.
        rstd: ``[rows, D // G]`` fp32, ``1 / sqrt(mean(u**2) + eps)`` per row and group.
    Meta: ``norm_before_gate`` (bool), ``group_size`` (int G), ``eps`` (float),
    ``activation`` (the forward's gate, canonical: ``"silu"`` or ``"sigmoid"``; the
    backward uses it), ``plan`` (the forward's RMSNormSiluGateDetPlan).

    Format 2: ``activation`` added to the meta (format 1 had a SiLU gate only).
    """

    tensor_names = ("x", "z", "weight", "rstd")
    format_version = 2


class RMSNormSiluGateDetWorkspace(Workspace):
    """fp32 partial-dweight rows ``[plan.bwd_programs, plan.hidden_size]`` for one plan.

    Build with :meth:`for_plan`. Reusing one workspace across steps avoids an allocation
    per backward; its contents are overwritten each call (no state carries over).
    """

    @classmethod
    def for_plan(cls, plan: RMSNormSiluGateDetPlan,
                 device: torch.device | str) -> RMSNormSiluGateDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` is not an RMSNormSiluGateDetPlan.
        """
        device = check_alloc_device(device)
        buffers = {name: torch.empty(shape, dtype=dtype, device=device)
                   for name, (shape, dtype) in cls._buffer_specs(plan).items()}
        return cls(plan, device, buffers)

    @classmethod
    def _buffer_specs(cls, plan: RMSNormSiluGateDetPlan
                      ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """``{name: (shape, dtype)}`` of what :meth:`for_plan` allocates for ``plan``
        (what ``workspace_bytes`` sums); ``ValueError`` for a plan of another type."""
        if not isinstance(plan, RMSNormSiluGateDetPlan):
            raise ValueError(f"plan: expected RMSNormSiluGateDetPlan, got {type(plan).__name__}")
        return workspace_specs(plan)


def workspace_specs(plan) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The workspace's one buffer for a plan with this package's fields (the nondet
    sibling's workspace has the same): fp32 partials ``[bwd_programs, hidden_size]``."""
    return {"partials": ((plan.bwd_programs, plan.hidden_size), torch.float32)}


__all__ = ["Mode", "RMSNormSiluGateDetSavedSet", "RMSNormSiluGateDetWorkspace"]
