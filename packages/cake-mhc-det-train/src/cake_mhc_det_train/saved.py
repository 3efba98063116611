"""MHCDetSavedSet (the handle between prepare and finish) and MHCDetWorkspace."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace
from cake_core.checks import check_alloc_device

from cake_mhc_det_train.plan import MHCDetPlan


class MHCDetSavedSet(SavedSet):
    """The handle :func:`~cake_mhc_det_train.mhc_det_prepare` returns and
    :func:`~cake_mhc_det_train.mhc_det_finish` takes: what the prepare keeps for the finish.

    Tensors (T tokens, n streams, M = 2n + n^2):
        coef: ``[T, M]`` fp32 per token ``[H_pre (n), H_post (n), H_res (n*n)]``, H_res row
            major with row j = output stream, column i = input stream. Part of the autograd
            graph: the finish's gradient of H_post and H_res flows through it into the
            prepare's backward.
        mix: ``[T, M]`` fp32, rstd * (x @ phi) (the logits before alpha and bias).
        rstd: ``[T]`` fp32, 1 / sqrt(mean(x^2) + eps) over the n*C values of a token.
        x_view: ``[T, n, C]``, a view of the prepare's X returned by its autograd node; the
            finish computes with it when given that same X, so the finish's part of dX
            reaches the prepare's backward and is added inside its dX kernel.
    Meta: ``plan`` (the MHCDetPlan), ``x_shape`` (X's shape), ``x_dtype``, ``eps``,
    ``sinkhorn_iters``, ``x_input`` (the X the prepare was given), ``ws_check`` (``None``,
    or ``(workspace, plan, device)``: the prepare's workspace, which the finish's backward
    checks again before it launches; ``None`` without a workspace or under
    ``torch.compile``).
    """

    tensor_names = ("coef", "mix", "rstd", "x_view")
    format_version = 1


def workspace_buffers(plan: MHCDetPlan, *, plan_cls: type = MHCDetPlan
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
    shape = (plan.dphi_slices, plan.n_streams * plan.hidden_size, plan.n_coeffs)
    return {"dphi_partials": (shape, torch.float32)}


class MHCDetWorkspace(Workspace):
    """fp32 partial-dphi planes ``[plan.dphi_slices, n*C, 2n + n^2]`` for one plan.

    Build with :meth:`for_plan`. Reusing one workspace across steps avoids an allocation
    per backward; every call overwrites its contents (no state carries over). One workspace
    serves one backward at a time: two layers whose backwards may run concurrently need two.
    The prepare checks it (type, mode, plan key, device, buffer) and, in eager mode, the
    backward checks it again before launching: a workspace whose mode, plan or device was
    changed between a prepare and its backward is refused with ``ValueError``.
    """

    @classmethod
    def for_plan(cls, plan: MHCDetPlan, device: torch.device | str) -> MHCDetWorkspace:
        """Allocate the buffers ``plan`` needs on ``device``."""
        device = check_alloc_device(device)
        bufs = {n: torch.empty(s, dtype=dt, device=device)
                for n, (s, dt) in workspace_buffers(plan).items()}
        return cls(plan, device, bufs)


__all__ = ["MHCDetSavedSet", "MHCDetWorkspace", "Mode", "workspace_buffers"]
