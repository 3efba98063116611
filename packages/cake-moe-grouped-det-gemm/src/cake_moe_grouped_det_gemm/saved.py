"""MoEGroupedDetSavedSet and MoEGroupedDetWorkspace (modes checked via cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_moe_grouped_det_gemm.plan import MoEGroupedDetPlan


class MoEGroupedDetSavedSet(SavedSet):
    """What the det forward keeps for the backward.

    Tensors:
        x: ``[M, K]``, the input (its dtype).
        weight: ``[E, N, K]``.
        ends: int32 ``[E]`` on the device, each expert's row end as the kernels read it
            (the caller's offsets clamped to ``[0, M]`` and made non-decreasing on the
            device; never read on the host).
    Meta: ``plan`` (the forward's MoEGroupedDetPlan).
    """

    tensor_names = ("x", "weight", "ends")
    format_version = 1


def workspace_buffers(plan: MoEGroupedDetPlan, *, plan_cls: type = MoEGroupedDetPlan
                      ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{name: (shape, dtype)}`` of what ``for_plan`` allocates for ``plan`` (what
    ``workspace_bytes`` sums), after checking that ``plan`` is a ``plan_cls`` of its mode
    (``plan_cls``: the nondet sibling passes its own).

    Raises:
        ValueError: ``plan`` of another type or mode.
    """
    mode = plan_cls.expected_mode
    if not isinstance(plan, plan_cls) or plan.mode != mode:
        raise ValueError(f"plan: expected {plan_cls.__name__} with mode={mode}, got "
                         f"{type(plan).__name__} (mode={getattr(plan, 'mode', 'none')})")
    return {n: (s, torch.float32) for n, s in workspace_shapes(plan).items()}


def workspace_shapes(plan: MoEGroupedDetPlan) -> dict[str, tuple[int, ...]]:
    """Shapes of the fp32 buffers ``plan`` needs: ``partials`` ``[S, E, N, K]`` when
    ``wgrad_splits`` S > 1, else an empty ``(0,)`` buffer. Independent of the token count
    and of how the tokens are split among the experts."""
    S = plan.wgrad_splits
    if S == 1:
        return {"partials": (0,)}
    return {"partials": (S, plan.num_experts, plan.out_features, plan.in_features)}


class MoEGroupedDetWorkspace(Workspace):
    """fp32 split-K partial planes for one plan: ``partials`` ``[S, E, N, K]``,
    S = ``plan.wgrad_splits`` (``(0,)`` when S = 1). Independent of the token count, so one
    workspace serves every batch and routing.

    Build with :meth:`for_plan`. Every element is overwritten each backward (an empty
    expert's planes with zeros), so no state carries over.
    """

    @classmethod
    def for_plan(cls, plan: MoEGroupedDetPlan, device: torch.device | str
                 ) -> MoEGroupedDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``."""
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device)
                for n, (s, dt) in workspace_buffers(plan).items()}
        return cls(plan, device, bufs)


__all__ = ["Mode", "MoEGroupedDetSavedSet", "MoEGroupedDetWorkspace", "workspace_buffers",
           "workspace_shapes"]
