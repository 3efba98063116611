"""Know before you launch, nondet: :func:`is_supported_nondet`,
:func:`workspace_bytes_nondet` and :func:`saved_bytes_nondet` of
:func:`~cake_kda_nondet_train.chunk_kda_nondet` and
:class:`~cake_kda_nondet_train.KDANondetWorkspace`: cake-kda-det-train's queries with this
package's kinds."""

from __future__ import annotations

import torch
from cake_core.support import Support
from cake_kda_det_train.queries import saved_bytes_for, support_query, workspace_bytes_for

from cake_kda_nondet_train.api import NONDET_KINDS
from cake_kda_nondet_train.plan import KDANondetPlan
from cake_kda_nondet_train.saved import KDANondetWorkspace

__all__ = ["is_supported_nondet", "saved_bytes_nondet", "workspace_bytes_nondet"]


def is_supported_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, scale: float | None = None,
                        initial_state: torch.Tensor | None = None,
                        output_final_state: bool = False,
                        use_qk_l2norm_in_kernel: bool = False,
                        cu_seqlens: torch.Tensor | None = None, *,
                        use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                        dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                        use_beta_sigmoid_in_kernel: bool = False,
                        allow_neg_eigval: bool = False, safe_gate: bool = False,
                        plan: KDANondetPlan | None = None,
                        workspace: KDANondetWorkspace | None = None,
                        **fla_kwargs) -> Support:
    """Whether :func:`~cake_kda_nondet_train.chunk_kda_nondet` serves this call (same
    arguments): ``Support(True, "")`` or ``Support(False, <the entry's ValueError
    message>)`` (a det plan or workspace is refused). Runs the entry's checks only:
    allocates no output, launches nothing; never raises ``ValueError``.

    Example: ``s = is_supported_nondet(q, k, v, g, beta)``, then ``if not s:
    print(s.reason)``.
    """
    return support_query(NONDET_KINDS, q, k, v, g, beta, scale, initial_state,
                         output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                         use_gate_in_kernel, A_log, dt_bias, lower_bound,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                         workspace, fla_kwargs)


def workspace_bytes_nondet(plan: KDANondetPlan, device: torch.device | str | None = None, *,
                           num_v_heads: int, max_tokens: int, max_seqs: int = 1,
                           dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``KDANondetWorkspace.for_plan(plan, device, ...)`` allocates (the same
    arguments; ``device`` optional), computed without allocating.

    Raises:
        ValueError: as ``for_plan`` (a det plan too).

    Example: ``workspace_bytes_nondet(make_nondet_plan(128, 128, torch.bfloat16, "cuda"),
    num_v_heads=32, max_tokens=32768)``.
    """
    return workspace_bytes_for(KDANondetWorkspace, NONDET_KINDS, plan, device,
                               num_v_heads=num_v_heads, max_tokens=max_tokens,
                               max_seqs=max_seqs, dtype=dtype)


def saved_bytes_nondet(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, scale: float | None = None,
                       initial_state: torch.Tensor | None = None,
                       output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                       cu_seqlens: torch.Tensor | None = None, *,
                       use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                       dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                       use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                       safe_gate: bool = False, plan: KDANondetPlan | None = None,
                       workspace: KDANondetWorkspace | None = None, **fla_kwargs) -> int:
    """The bytes :func:`~cake_kda_nondet_train.chunk_kda_nondet` (same arguments)
    allocates and keeps for the backward, as ``cake_kda_det_train.saved_bytes`` counts
    them (the caller's tensors not counted; the entry's checks refuse meta tensors),
    computed without running anything.

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes_nondet(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)``.
    """
    return saved_bytes_for(NONDET_KINDS, q, k, v, g, beta, scale, initial_state,
                           output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                           use_gate_in_kernel, A_log, dt_bias, lower_bound,
                           use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                           workspace, fla_kwargs)
