"""MHCNondetSavedSet (the handle between prepare and finish) and MHCNondetWorkspace (mode
``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device
from cake_mhc_det_train.saved import workspace_buffers

from cake_mhc_nondet_train.plan import MHCNondetPlan


class MHCNondetSavedSet(SavedSet):
    """The handle :func:`~cake_mhc_nondet_train.mhc_nondet_prepare` returns and
    :func:`~cake_mhc_nondet_train.mhc_nondet_finish` takes (mode ``nondet``): tensors
    ``coef``, ``mix``, ``rstd``, ``x_view`` and the meta of cake-mhc-det-train's
    ``MHCDetSavedSet`` (read its docstring), with an :class:`MHCNondetPlan`. A det finish
    refuses it and this package refuses the det one."""

    tensor_names = ("coef", "mix", "rstd", "x_view")
    format_version = 1


class MHCNondetWorkspace(Workspace):
    """fp32 partial-dphi planes ``[plan.dphi_slices, n*C, 2n + n^2]`` for one plan (mode
    ``nondet``). Build with :meth:`for_plan`; every backward overwrites it; one workspace
    serves one backward at a time. Checked at the prepare and, in eager mode, again before
    the backward launches."""

    @classmethod
    def for_plan(cls, plan: MHCNondetPlan, device: torch.device | str) -> MHCNondetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``.

        Raises:
            ValueError: ``plan`` not an :class:`MHCNondetPlan`, a bad device.
        """
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device) for n, (s, dt) in
                workspace_buffers(plan, plan_cls=MHCNondetPlan).items()}
        return cls(plan, device, bufs)


__all__ = ["MHCNondetSavedSet", "MHCNondetWorkspace", "Mode"]
