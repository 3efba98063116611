"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes`, :func:`saved_bytes`
of the det causal conv1d (cake_core.support's contract). The ``*_for`` bodies take the mode
classes so cake-causal-conv1d-nondet-train answers for its own plans and workspaces."""

from __future__ import annotations

import torch
from cake_core.checks import check_alloc_device
from cake_core.support import Support, nbytes_of, support_of
from cake_core.triton_utils import default_device

from cake_causal_conv1d_det_train.api import DET, ModeClasses, check_call
from cake_causal_conv1d_det_train.plan import CausalConv1dDetPlan
from cake_causal_conv1d_det_train.saved import CausalConv1dDetWorkspace


def is_supported_for(m: ModeClasses, x, weight, bias, activation, cu_seqlens, initial_state,
                     output_final_state, plan, workspace) -> Support:
    """The body of :func:`is_supported` for the mode classes ``m``."""
    return support_of(lambda: check_call(m, x, weight, bias, activation, cu_seqlens,
                                         initial_state, output_final_state, plan, workspace))


def workspace_bytes_for(m: ModeClasses, plan, device, max_tokens, max_seqs) -> int:
    """The body of :func:`workspace_bytes` for the mode classes ``m``."""
    device = default_device() if device is None else check_alloc_device(device)
    return nbytes_of(m.workspace._buffer_specs(plan, device, max_tokens, max_seqs).values())


def saved_bytes_for(m: ModeClasses, x, weight, bias, activation, cu_seqlens, initial_state,
                    output_final_state, plan, workspace) -> int:
    """The body of :func:`saved_bytes` for the mode classes ``m``."""
    check_call(m, x, weight, bias, activation, cu_seqlens, initial_state, output_final_state,
               plan, workspace, launch=False)
    return 0  # the saved set holds the caller's tensors only (the backward recomputes pre)


def is_supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 activation: str | None = None, cu_seqlens: torch.Tensor | None = None,
                 initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                 plan: CausalConv1dDetPlan | None = None,
                 workspace: CausalConv1dDetWorkspace | None = None) -> Support:
    """Whether :func:`~cake_causal_conv1d_det_train.causal_conv1d_det` serves this call (its
    arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise. Runs the entry's checks only: no allocation or
    kernel launch; never raises ``ValueError``. Like the entry it reads ``cu_seqlens``'
    values (one host sync, remembered per tensor). Tensors must be on the device the kernels
    run on (CUDA; the CPU under ``TRITON_INTERPRET=1``), as for the entry.

    Example::

        is_supported(torch.randn(2, 40, 64), torch.randn(64, 4), activation="silu").ok
    """
    return is_supported_for(DET, x, weight, bias, activation, cu_seqlens, initial_state,
                            output_final_state, plan, workspace)


def workspace_bytes(plan: CausalConv1dDetPlan, device: torch.device | str | None = None, *,
                    max_tokens: int, max_seqs: int = 1) -> int:
    """Bytes ``CausalConv1dDetWorkspace.for_plan(plan, device, max_tokens=...,
    max_seqs=...)`` allocates, computed without allocating: fp32 ``dweight_partials``
    ``[P, D, W]`` and ``dbias_partials`` ``[P, D]`` (P = ``max_blocks(max_tokens, max_seqs,
    plan.block_t_bwd)``), and with ``plan.bwd_da_once`` the ``da_scratch`` whose size
    follows the device's SM count (``device`` ``None``: CUDA's current device when kernels
    compile for CUDA, else the CPU).

    Raises:
        ValueError: as ``for_plan``: a plan of another type or mode, ``max_tokens`` not an
            int >= 0, ``max_seqs`` not an int >= 1, a bad ``device``.

    Example::

        workspace_bytes(make_plan(2048, 4, torch.bfloat16, "cpu"), max_tokens=8 * 4096,
                        max_seqs=8)
    """
    return workspace_bytes_for(DET, plan, device, max_tokens, max_seqs)


def saved_bytes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                activation: str | None = None, cu_seqlens: torch.Tensor | None = None,
                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                plan: CausalConv1dDetPlan | None = None,
                workspace: CausalConv1dDetWorkspace | None = None) -> int:
    """Bytes the forward of :func:`~cake_causal_conv1d_det_train.causal_conv1d_det`
    allocates and keeps for the backward: 0. Its saved set holds the caller's x, weight,
    bias, initial_state and cu_seqlens only (the backward recomputes the pre-activation;
    ``final_state`` is returned, not read back); the int64 sequence offsets it keeps live on
    the host (``N + 1`` values). Tensors on any device work (the meta device included: the
    launch-device check is skipped, and a meta ``cu_seqlens``' values are not read).

    Raises:
        ValueError: any other bad argument, with the entry's message.

    Example::

        saved_bytes(torch.empty(2, 4096, 2048, device="meta"),
                    torch.empty(2048, 4, device="meta"))   # 0
    """
    return saved_bytes_for(DET, x, weight, bias, activation, cu_seqlens, initial_state,
                           output_final_state, plan, workspace)


__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]
