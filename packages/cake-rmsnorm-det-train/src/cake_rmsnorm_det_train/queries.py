"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes`, :func:`saved_bytes`
of det RMSNorm (cake_core.support's contract). The ``*_for`` bodies take a ``ModeKinds``
so cake-rmsnorm-nondet-train answers for its own plans and workspaces."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_rmsnorm_det_train.api import DET_KINDS, ModeKinds, check_call
from cake_rmsnorm_det_train.plan import RMSNormDetPlan
from cake_rmsnorm_det_train.saved import RMSNormDetWorkspace


def is_supported_for(kinds: ModeKinds, x, weight, eps, residual, plan, workspace,
                     dweight_accumulator, offset=0.0) -> Support:
    """The body of :func:`is_supported` for ``kinds``."""
    return support_of(lambda: check_call(kinds, x, weight, eps, residual, plan, workspace,
                                         dweight_accumulator, offset=offset))


def workspace_bytes_for(kinds: ModeKinds, plan, device) -> int:
    """The body of :func:`workspace_bytes` for ``kinds``."""
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(kinds.workspace_type._buffer_specs(plan).values())


def saved_bytes_for(kinds: ModeKinds, x, weight, eps, residual, plan, workspace,
                    dweight_accumulator, offset=0.0) -> int:
    """The body of :func:`saved_bytes` for ``kinds``."""
    check_call(kinds, x, weight, eps, residual, plan, workspace, dweight_accumulator,
               launch=False, offset=offset)
    n_rows = x.numel() // x.shape[-1]
    specs = [((n_rows,), torch.float32)]  # rstd
    if residual is not None:
        specs.append((tuple(x.shape), x.dtype))  # h = x + residual, returned and saved
    return nbytes_of(specs)


def is_supported(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                 offset: float = 0.0,
                 residual: torch.Tensor | None = None, plan: RMSNormDetPlan | None = None,
                 workspace: RMSNormDetWorkspace | None = None,
                 dweight_accumulator: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_rmsnorm_det_train.rmsnorm_det` serves this call (its arguments):
    ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise. Runs the entry's checks only: no allocation,
    launch or mode change; never raises ``ValueError``. Tensors must be on the device the
    kernels run on (CUDA; the CPU under ``TRITON_INTERPRET=1``), as for the entry.

    Example::

        is_supported(torch.randn(8, 64), torch.ones(64)).ok   # True (CPU: interpreter)
    """
    return is_supported_for(DET_KINDS, x, weight, eps, residual, plan, workspace,
                            dweight_accumulator, offset)


def workspace_bytes(plan: RMSNormDetPlan, device: torch.device | str | None = None) -> int:
    """Bytes :meth:`RMSNormDetWorkspace.for_plan(plan, device)
    <cake_rmsnorm_det_train.RMSNormDetWorkspace.for_plan>` allocates (fp32
    ``[plan.bwd_programs, plan.hidden_size]``), computed without allocating.

    Raises:
        ValueError: ``plan`` is not an RMSNormDetPlan, or a bad ``device`` (as ``for_plan``).

    Example::

        workspace_bytes(make_plan(4096, torch.bfloat16, "cpu"))
    """
    return workspace_bytes_for(DET_KINDS, plan, device)


def saved_bytes(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
                offset: float = 0.0,
                residual: torch.Tensor | None = None, plan: RMSNormDetPlan | None = None,
                workspace: RMSNormDetWorkspace | None = None,
                dweight_accumulator: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_rmsnorm_det_train.rmsnorm_det` allocates and keeps
    for the backward: ``rstd`` (fp32 per row) and, with a residual, ``h`` (x's shape and
    dtype; also returned). x and weight are the caller's and do not count. Computed from
    shapes and dtypes; tensors on any device work (the meta device included: the entry's
    launch-device check is the one check skipped).

    Raises:
        ValueError: any other bad argument, with the entry's message.

    Example::

        saved_bytes(torch.empty(4096, 2048, device="meta"), torch.empty(2048, device="meta"))
    """
    return saved_bytes_for(DET_KINDS, x, weight, eps, residual, plan, workspace,
                           dweight_accumulator, offset)


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
