"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of :func:`~cake_kda_det_train.chunk_kda_det` and
:class:`~cake_kda_det_train.KDADetWorkspace` (the shared rules: ``cake_core.support``).

The ``*_for`` functions take the mode's kinds (:class:`cake_kda_det_train.api.ModeKinds`):
cake-kda-nondet-train's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.linear_attention import inter_dtype
from cake_core.support import Support, nbytes_of, support_of
from cake_core.varlen import max_chunks

from cake_kda_det_train.api import DET_KINDS, ModeKinds, autograd_checks
from cake_kda_det_train.chunk import kept_a_shape
from cake_kda_det_train.plan import CHUNK_SIZE, KDADetPlan
from cake_kda_det_train.saved import KDADetWorkspace, workspace_layout

__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]


def is_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, scale: float | None = None,
                 initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                 use_qk_l2norm_in_kernel: bool = False,
                 cu_seqlens: torch.Tensor | None = None, *, use_gate_in_kernel: bool = False,
                 A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                 lower_bound: float | None = None, use_beta_sigmoid_in_kernel: bool = False,
                 allow_neg_eigval: bool = False, safe_gate: bool = False,
                 plan: KDADetPlan | None = None, workspace: KDADetWorkspace | None = None,
                 **fla_kwargs) -> Support:
    """Whether :func:`~cake_kda_det_train.chunk_kda_det` serves this call (same
    arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the message of the
    ``ValueError`` the entry would raise. Runs the entry's checks only (with ``cu_seqlens``
    they read its values, one host sync, as the entry does); allocates no output and
    launches nothing. Never raises ``ValueError``.

    Example: ``s = is_supported(q, k, v, g, beta, cu_seqlens=cu)``, then ``if not s:
    print(s.reason)``.
    """
    return support_query(DET_KINDS, q, k, v, g, beta, scale, initial_state,
                         output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                         use_gate_in_kernel, A_log, dt_bias, lower_bound,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                         workspace, fla_kwargs)


def workspace_bytes(plan: KDADetPlan, device: torch.device | str | None = None, *,
                    num_v_heads: int, max_tokens: int, max_seqs: int = 1,
                    dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``KDADetWorkspace.for_plan(plan, device, num_v_heads=..., max_tokens=...,
    max_seqs=..., dtype=...)`` allocates (w, u, v_new, aqk ``[max_tokens, HV, *]`` and h
    ``[nc, HV, K, V]`` in the intermediates' dtype), computed without allocating.
    ``device`` is optional (checked when given).

    Raises:
        ValueError: as ``for_plan``.

    Example: ``workspace_bytes(make_plan(128, 128, torch.bfloat16, "cuda"), num_v_heads=32,
    max_tokens=32768, max_seqs=8)``.
    """
    return workspace_bytes_for(KDADetWorkspace, DET_KINDS, plan, device,
                               num_v_heads=num_v_heads, max_tokens=max_tokens,
                               max_seqs=max_seqs, dtype=dtype)


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None,
                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                use_qk_l2norm_in_kernel: bool = False, cu_seqlens: torch.Tensor | None = None,
                *, use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                dt_bias: torch.Tensor | None = None, lower_bound: float | None = None,
                use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                safe_gate: bool = False, plan: KDADetPlan | None = None,
                workspace: KDADetWorkspace | None = None, **fla_kwargs) -> int:
    """The bytes :func:`~cake_kda_det_train.chunk_kda_det` (same arguments) allocates and
    keeps for the backward, computed from shapes, dtypes and the plan without running
    anything: g's within-chunk cumulative sum (fp32 ``[B*T, HV, K]``), T and Aqk stacked
    (``[2, B*T, HV, 64]`` in the intermediates' dtype), with the L2 norm the normalised q
    and k (``[B, T, H, K]`` in q's dtype, kept instead of the caller's q and k) and their
    rstds (fp32 ``[B, T, H]`` each), with ``plan.keep_states`` the chunk states h (``[NC,
    HV, K, V]``, NC the 64-token chunks of the sequences), w and kg (``[B*T, HV, K]``) and
    v_new (``[B*T, HV, V]``) in the intermediates' dtype, the fp32 copy of a 16-bit
    ``initial_state`` and the device copy of ``cu_seqlens`` (int64 ``[N + 1]``, in one
    storage with the chunk tables) when it is not the caller's tensor. The caller's
    tensors are not counted (the backward keeps those it reads). The checks are the entry's,
    which refuse meta tensors (a device kernels can launch on is needed).

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)``.
    """
    return saved_bytes_for(DET_KINDS, q, k, v, g, beta, scale, initial_state,
                           output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
                           use_gate_in_kernel, A_log, dt_bias, lower_bound,
                           use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, plan,
                           workspace, fla_kwargs)


def support_query(kinds: ModeKinds, *args) -> Support:
    """:func:`is_supported` of the autograd entry of ``kinds`` (``args``: its arguments
    in order, then the FLA keywords' dict)."""
    return support_of(lambda: autograd_checks(kinds, *args, convert_state=False))


def workspace_bytes_for(workspace_type: type, kinds: ModeKinds, plan, device, *,
                        num_v_heads: int, max_tokens: int, max_seqs: int,
                        dtype: torch.dtype) -> int:
    """:func:`workspace_bytes` of ``workspace_type.for_plan`` (the plans of ``kinds``)."""
    if device is not None:
        from cake_core.checks import check_alloc_device

        check_alloc_device(device)
    layout, _ = workspace_layout(kinds.plan_type, kinds.mode, plan, num_v_heads, max_tokens,
                                 max_seqs, dtype)
    return nbytes_of(layout.values())


def saved_bytes_for(kinds: ModeKinds, q, k, v, g, beta, scale, initial_state,
                    output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, *rest) -> int:
    """:func:`saved_bytes` of the autograd entry of ``kinds`` (``rest``: its arguments
    after ``cu_seqlens`` in order, then the FLA keywords' dict)."""
    _, (_, N, _, _, _, _, _, plan, seqs) = autograd_checks(
        kinds, q, k, v, g, beta, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, *rest, convert_state=False)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, f32 = B * T, torch.float32
    idt = inter_dtype(plan, q.dtype)
    shapes = [((NT, HV, K), f32), (kept_a_shape(NT, HV), idt)]
    if use_qk_l2norm_in_kernel:
        shapes += [((B, T, H, K), q.dtype)] * 2 + [((B, T, H), f32)] * 2
    if plan.keep_states:  # h has a row per chunk (eager; traced: the most there can be)
        nc = seqs.num_chunks if seqs is not None else max_chunks(NT, N, CHUNK_SIZE)
        shapes += [((nc, HV, K, V), idt), ((NT, HV, K), idt),
                   ((NT, HV, K), idt), ((NT, HV, V), idt)]
    if initial_state is not None and initial_state.dtype != f32:  # the entry's fp32 copy
        shapes.append(((N, HV, K, V), f32))
    total = nbytes_of(shapes)
    if cu_seqlens is not None and seqs is not None:
        s = seqs.cu.untyped_storage()
        if s.data_ptr() != cu_seqlens.untyped_storage().data_ptr():
            total += s.nbytes()  # the device offsets, uploaded with the chunk tables
    return total
