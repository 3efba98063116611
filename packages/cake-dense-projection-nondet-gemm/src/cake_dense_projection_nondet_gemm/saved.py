"""DenseProjectionNondetSavedSet and DenseProjectionNondetWorkspace (mode ``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device
from cake_dense_projection_det_gemm.saved import workspace_buffers

from cake_dense_projection_nondet_gemm.plan import DenseProjectionNondetPlan


class DenseProjectionNondetSavedSet(SavedSet):
    """What :func:`~cake_dense_projection_nondet_gemm.dense_projection_nondet_fwd` keeps
    for :func:`~cake_dense_projection_nondet_gemm.dense_projection_nondet_bwd` (mode
    ``nondet``): tensors ``x`` ``[..., K]`` and ``weight`` ``[N, K]``; meta ``has_bias`` and
    ``plan`` (a :class:`DenseProjectionNondetPlan`). A det backward refuses it and this
    package refuses the det one."""

    tensor_names = ("x", "weight")
    format_version = 1


class DenseProjectionNondetWorkspace(Workspace):
    """The wgrad's fp32 split-K partials for one plan (mode ``nondet``): ``partials``
    ``[S, N, K]`` and ``bias_partials`` ``[S, N]``, S = ``plan.wgrad_splits`` (both ``(0,)``
    when S = 1); independent of the token count. Build with :meth:`for_plan`; every
    backward overwrites them."""

    @classmethod
    def for_plan(cls, plan: DenseProjectionNondetPlan, device: torch.device | str
                 ) -> DenseProjectionNondetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` not a :class:`DenseProjectionNondetPlan`, a bad device.
        """
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device) for n, (s, dt) in
                workspace_buffers(plan, plan_cls=DenseProjectionNondetPlan).items()}
        return cls(plan, device, bufs)


__all__ = ["DenseProjectionNondetSavedSet", "DenseProjectionNondetWorkspace", "Mode"]
