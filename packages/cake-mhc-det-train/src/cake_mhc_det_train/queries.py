"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of the det mHC layer's prepare (``cake_core.support``)."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of

from cake_mhc_det_train.api import _checks
from cake_mhc_det_train.plan import MHCDetPlan, n_coeffs
from cake_mhc_det_train.saved import MHCDetWorkspace, workspace_buffers


def is_supported(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor,
                 *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                 plan: MHCDetPlan | None = None,
                 workspace: MHCDetWorkspace | None = None) -> Support:
    """Whether :func:`~cake_mhc_det_train.mhc_det_prepare` serves this call, with its own
    arguments: ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` it would raise. Runs its checks only (no allocation, no launch); never
    raises ``ValueError``. (:func:`~cake_mhc_det_train.mhc_det_finish` takes the prepare's
    X and its branch output of X's leading shape, checked there.)

    Example::

        n, C = 4, 16
        is_supported(torch.randn(8, n, C), torch.randn(n * C, 24), torch.ones(3),
                     torch.zeros(24)).ok   # True
    """
    return support_of(lambda: _checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan,
                                      workspace))


def workspace_bytes(plan: MHCDetPlan, device: torch.device | str | None = None) -> int:
    """Bytes ``MHCDetWorkspace.for_plan(plan, device)`` allocates (fp32
    ``[plan.dphi_slices, n*C, 2n + n^2]``), computed without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not a det
            :class:`MHCDetPlan`.

    Example::

        workspace_bytes(make_plan(4, 4096, torch.bfloat16, "cpu"))
    """
    if device is not None:
        check_alloc_device(device)
    return nbytes_of(workspace_buffers(plan).values())


def _x3_copies(X: torch.Tensor) -> bool:
    """Whether the prepare's ``X.reshape(-1, n, C)`` copies X (leading dims that no view
    merges): the copy is then what the backward reads."""
    try:
        X.view(-1, X.shape[-2], X.shape[-1])
    except RuntimeError:
        return True
    return False


def saved_bytes(X: torch.Tensor, phi: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor,
                *, eps: float = 1e-6, sinkhorn_iters: int = 20,
                plan: MHCDetPlan | None = None,
                workspace: MHCDetWorkspace | None = None) -> int:
    """Bytes :func:`~cake_mhc_det_train.mhc_det_prepare` allocates and keeps (in its
    handle and its autograd node) for the backward, with its own arguments: fp32 ``coef``
    and ``mix`` ``[T, 2n + n^2]`` and ``rstd`` ``[T]``, plus X's ``[T, n, C]`` copy when
    X's leading dims cannot be flattened as a view (X itself, phi, alpha and bias are the
    caller's; the finish keeps nothing more than the caller's B). Computed from shapes and
    strides only; tensors on the meta device are served (the backend's device check is
    skipped, the others are run).

    Raises:
        ValueError: the prepare's, for bad arguments.

    Example::

        X = torch.empty(2, 8, 4, 16, device="meta")
        saved_bytes(X, torch.empty(64, 24, device="meta"), torch.empty(3, device="meta"),
                    torch.empty(24, device="meta"))   # 16 * (2 * 24 + 1) * 4
    """
    _checks(X, phi, alpha, bias, eps, sinkhorn_iters, plan, workspace, launch=False)
    return _kept_bytes(X)


def _kept_bytes(X: torch.Tensor) -> int:
    """The prepare's kept bytes for a checked X (also the nondet sibling's)."""
    n, C = X.shape[-2], X.shape[-1]
    T = X.numel() // (n * C)
    M = n_coeffs(n)
    kept = [((T, M), torch.float32), ((T, M), torch.float32), ((T,), torch.float32)]
    if _x3_copies(X):
        kept.append(((T, n, C), X.dtype))
    return nbytes_of(kept)


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
