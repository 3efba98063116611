"""MoEGroupedNondetSavedSet and MoEGroupedNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device
from cake_moe_grouped_det_gemm.saved import workspace_buffers

from cake_moe_grouped_nondet_gemm.plan import MoEGroupedNondetPlan


class MoEGroupedNondetSavedSet(SavedSet):
    """What :func:`~cake_moe_grouped_nondet_gemm.moe_grouped_nondet_gemm_fwd` keeps for
    :func:`~cake_moe_grouped_nondet_gemm.moe_grouped_nondet_gemm_bwd` (mode ``nondet``):
    tensors ``x`` ``[M, K]``, ``weight`` ``[E, N, K]`` and ``ends`` (int32 ``[E]``, the row
    ends as the kernels read them); meta ``plan`` (a :class:`MoEGroupedNondetPlan`). A det
    backward refuses it and this package refuses the det one."""

    tensor_names = ("x", "weight", "ends")
    format_version = 1


class MoEGroupedNondetWorkspace(Workspace):
    """The wgrad's fp32 split-K partials for one plan (mode ``nondet``): ``partials``
    ``[S, E, N, K]``, S = ``plan.wgrad_splits`` (``(0,)`` when S = 1); independent of the
    token count and the routing. Build with :meth:`for_plan`; every backward overwrites it."""

    @classmethod
    def for_plan(cls, plan: MoEGroupedNondetPlan, device: torch.device | str
                 ) -> MoEGroupedNondetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` not a :class:`MoEGroupedNondetPlan`, a bad device.
        """
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device) for n, (s, dt) in
                workspace_buffers(plan, plan_cls=MoEGroupedNondetPlan).items()}
        return cls(plan, device, bufs)


__all__ = ["Mode", "MoEGroupedNondetSavedSet", "MoEGroupedNondetWorkspace"]
