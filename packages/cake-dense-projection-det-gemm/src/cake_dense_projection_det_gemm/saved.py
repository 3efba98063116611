"""DenseProjectionDetSavedSet and DenseProjectionDetWorkspace (modes checked via cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_dense_projection_det_gemm.plan import DenseProjectionDetPlan


class DenseProjectionDetSavedSet(SavedSet):
    """What the det forward keeps for the backward.

    Tensors:
        x: ``[..., K]``, the input (its dtype).
        weight: ``[N, K]``.
    Meta: ``has_bias`` (bool), ``plan`` (the forward's DenseProjectionDetPlan).
    """

    tensor_names = ("x", "weight")
    format_version = 1


def workspace_buffers(plan: DenseProjectionDetPlan, *, plan_cls: type = DenseProjectionDetPlan
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


def workspace_shapes(plan: DenseProjectionDetPlan) -> dict[str, tuple[int, ...]]:
    """Shapes of the fp32 buffers ``plan`` needs: ``partials`` ``[S, N, K]`` and
    ``bias_partials`` ``[S, N]`` when ``wgrad_splits`` S > 1, else empty ``(0,)`` buffers.
    Independent of the token count M."""
    S, N, K = plan.wgrad_splits, plan.out_features, plan.in_features
    if S == 1:
        return {"partials": (0,), "bias_partials": (0,)}
    return {"partials": (S, N, K), "bias_partials": (S, N)}


class DenseProjectionDetWorkspace(Workspace):
    """fp32 split-K partial planes for one plan: ``partials`` ``[S, N, K]`` (dweight) and
    ``bias_partials`` ``[S, N]`` (dbias), S = ``plan.wgrad_splits`` (both ``(0,)`` when
    S = 1). Independent of the token count, so one workspace serves every batch shape.

    Build with :meth:`for_plan`. Its contents are overwritten each backward (no state
    carries over).
    """

    @classmethod
    def for_plan(cls, plan: DenseProjectionDetPlan, device: torch.device | str
                 ) -> DenseProjectionDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``."""
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device)
                for n, (s, dt) in workspace_buffers(plan).items()}
        return cls(plan, device, bufs)


__all__ = ["DenseProjectionDetSavedSet", "DenseProjectionDetWorkspace", "Mode",
           "workspace_buffers", "workspace_shapes"]
