"""MHCNondetSavedSet (the handle between prepare and finish) and MHCNondetWorkspace (mode
``nondet``)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

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
        if not isinstance(plan, MHCNondetPlan) or plan.mode != Mode.NONDET:
            raise ValueError(f"plan: expected MHCNondetPlan with mode=nondet, got "
                             f"{type(plan).__name__} (mode={getattr(plan, 'mode', 'none')})")
        parts = torch.empty(plan.dphi_slices, plan.n_streams * plan.hidden_size, plan.n_coeffs,
                            dtype=torch.float32, device=device)
        return cls(plan, device, {"dphi_partials": parts})


__all__ = ["MHCNondetSavedSet", "MHCNondetWorkspace", "Mode"]
