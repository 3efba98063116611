"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet` and
:func:`saved_bytes_nondet` of the nondet LM-head loss (``cake_core.support``): the det
package's queries with this package's plan and workspace classes."""

from __future__ import annotations

import torch
from cake_core.support import Support
from cake_lm_head_loss_det_train.queries import _is_supported, _saved_bytes, _workspace_bytes

from cake_lm_head_loss_nondet_train.api import _M
from cake_lm_head_loss_nondet_train.plan import LMHeadLossNondetPlan
from cake_lm_head_loss_nondet_train.saved import LMHeadLossNondetWorkspace


def is_supported_nondet(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                        bias: torch.Tensor | None = None, ignore_index: int = -100,
                        reduction: str = "mean", label_smoothing: float = 0.0,
                        z_loss: float = 0.0, logit_softcap: float | None = None,
                        return_lse: bool = False, plan: LMHeadLossNondetPlan | None = None,
                        workspace: LMHeadLossNondetWorkspace | None = None,
                        main_grad: torch.Tensor | None = None) -> Support:
    """Whether :func:`~cake_lm_head_loss_nondet_train.lm_head_loss_nondet` serves this call,
    with its own arguments: ``Support(True, "")`` or ``Support(False, reason)`` (the
    entry's ``ValueError`` message). As ``cake_lm_head_loss_det_train.is_supported``: the
    entry's checks only, label values read only on the CPU; never raises ``ValueError``.

    Example::

        is_supported_nondet(torch.randn(4, 16), torch.randn(32, 16),
                            torch.tensor([1, 2, 3, 4])).ok   # True
    """
    return _is_supported(_M, hidden, weight, labels, bias, ignore_index, reduction,
                         label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad,
                         return_lse=return_lse)


def workspace_bytes_nondet(plan: LMHeadLossNondetPlan,
                           device: torch.device | str | None = None,
                           dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes ``LMHeadLossNondetWorkspace.for_plan(plan, device, dtype)`` allocates,
    computed without allocating.

    Raises:
        ValueError: as ``for_plan``: a bad ``device`` (when given), ``plan`` not an
            :class:`LMHeadLossNondetPlan`, ``dtype`` not fp32 / bf16 / fp16.

    Example::

        workspace_bytes_nondet(make_nondet_plan(4096, 128256, torch.bfloat16, "cpu"))
    """
    return _workspace_bytes(LMHeadLossNondetPlan, plan, device, dtype)


def saved_bytes_nondet(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                       bias: torch.Tensor | None = None, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       z_loss: float = 0.0, logit_softcap: float | None = None,
                       return_lse: bool = False, plan: LMHeadLossNondetPlan | None = None,
                       workspace: LMHeadLossNondetWorkspace | None = None,
                       main_grad: torch.Tensor | None = None) -> int:
    """Bytes the forward of :func:`~cake_lm_head_loss_nondet_train.lm_head_loss_nondet`
    allocates and keeps for the backward when every input needs its gradient: as
    ``cake_lm_head_loss_det_train.saved_bytes`` (lse, the valid count, the forward's
    gradients under ``plan.grad_in_forward``, flattening copies). Meta tensors are served.

    Raises:
        ValueError: the entry's, for bad arguments (label values aside).

    Example::

        saved_bytes_nondet(torch.empty(4, 16, device="meta"),
                           torch.empty(32, 16, device="meta"),
                           torch.empty(4, dtype=torch.int64, device="meta"))
    """
    return _saved_bytes(_M, hidden, weight, labels, bias, ignore_index, reduction,
                        label_smoothing, z_loss, logit_softcap, plan, workspace, main_grad)


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
