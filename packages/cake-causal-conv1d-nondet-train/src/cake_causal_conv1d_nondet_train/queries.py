"""Know before you launch: :func:`is_supported_nondet`, :func:`workspace_bytes_nondet`,
:func:`saved_bytes_nondet` (cake_core.support's contract), cake-causal-conv1d-det-train's
queries run with this package's plans and workspaces."""

from __future__ import annotations

import torch
from cake_causal_conv1d_det_train.queries import (
    is_supported_for,
    saved_bytes_for,
    workspace_bytes_for,
)
from cake_core.support import Support

from cake_causal_conv1d_nondet_train.api import _M
from cake_causal_conv1d_nondet_train.plan import CausalConv1dNondetPlan
from cake_causal_conv1d_nondet_train.saved import CausalConv1dNondetWorkspace


def is_supported_nondet(x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None = None, *, activation: str | None = None,
                        cu_seqlens: torch.Tensor | None = None,
                        initial_state: torch.Tensor | None = None,
                        output_final_state: bool = False,
                        plan: CausalConv1dNondetPlan | None = None,
                        workspace: CausalConv1dNondetWorkspace | None = None) -> Support:
    """Whether :func:`~cake_causal_conv1d_nondet_train.causal_conv1d_nondet` serves this
    call (its arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the
    message of the ``ValueError`` the entry would raise (e.g. for a det plan). Runs the
    entry's checks only: no allocation or kernel launch (like the entry it reads
    ``cu_seqlens``' values once); never raises ``ValueError``. Tensors must be on the
    device the kernels run on, as for the entry.

    Example::

        is_supported_nondet(torch.randn(2, 40, 64), torch.randn(64, 4)).ok   # True on CPU
    """
    return is_supported_for(_M, x, weight, bias, activation, cu_seqlens, initial_state,
                            output_final_state, plan, workspace)


def workspace_bytes_nondet(plan: CausalConv1dNondetPlan,
                           device: torch.device | str | None = None, *, max_tokens: int,
                           max_seqs: int = 1) -> int:
    """Bytes ``CausalConv1dNondetWorkspace.for_plan(plan, device, max_tokens=...,
    max_seqs=...)`` allocates, computed without allocating (the buffers of the det
    package's ``workspace_bytes``; ``device`` ``None``: CUDA's current device when kernels
    compile for CUDA, else the CPU).

    Raises:
        ValueError: as ``for_plan``: a plan of another type or mode (e.g. a det plan),
            ``max_tokens`` not an int >= 0, ``max_seqs`` not an int >= 1, a bad ``device``.

    Example::

        workspace_bytes_nondet(make_nondet_plan(2048, 4, torch.bfloat16, "cpu"),
                               max_tokens=32768, max_seqs=8)
    """
    return workspace_bytes_for(_M, plan, device, max_tokens, max_seqs)


def saved_bytes_nondet(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, *, activation: str | None = None,
                       cu_seqlens: torch.Tensor | None = None,
                       initial_state: torch.Tensor | None = None,
                       output_final_state: bool = False,
                       plan: CausalConv1dNondetPlan | None = None,
                       workspace: CausalConv1dNondetWorkspace | None = None) -> int:
    """Bytes the forward of :func:`~cake_causal_conv1d_nondet_train.causal_conv1d_nondet`
    allocates and keeps for the backward: 0 (its saved set holds the caller's tensors only;
    the sequence offsets live on the host). Tensors on any device work (meta included: the
    launch-device check is skipped, a meta ``cu_seqlens``' values are not read).

    Raises:
        ValueError: any other bad argument, with the entry's message.

    Example::

        saved_bytes_nondet(torch.empty(2, 4096, 2048, device="meta"),
                           torch.empty(2048, 4, device="meta"))   # 0
    """
    return saved_bytes_for(_M, x, weight, bias, activation, cu_seqlens, initial_state,
                           output_final_state, plan, workspace)


__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]
