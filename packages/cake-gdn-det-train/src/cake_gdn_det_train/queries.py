"""Know before you launch: :func:`is_supported`, :func:`workspace_bytes` and
:func:`saved_bytes` of :func:`~cake_gdn_det_train.chunk_gated_delta_rule_det` and
:class:`~cake_gdn_det_train.GDNDetWorkspace` (the shared rules: ``cake_core.support``).

The ``*_for`` functions take the mode's types (:class:`cake_gdn_det_train.api.ModeTypes`):
cake-gdn-nondet-train's queries are these with its own."""

from __future__ import annotations

import torch
from cake_core.linear_attention import inter_dtype
from cake_core.support import Support, nbytes_of, support_of

from cake_gdn_det_train.api import DET, ModeTypes, entry_checks
from cake_gdn_det_train.plan import CHUNK_SIZE, GDNDetPlan
from cake_gdn_det_train.saved import GDNDetWorkspace, max_chunks, workspace_layout

__all__ = ["is_supported", "saved_bytes", "workspace_bytes"]

_ENTRY = "chunk_gated_delta_rule_det"


def is_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, scale: float | None = None,
                 initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                 use_qk_l2norm_in_kernel: bool = False,
                 cu_seqlens: torch.Tensor | None = None, *, plan: GDNDetPlan | None = None,
                 use_gate_in_kernel: bool = False, A_log: torch.Tensor | None = None,
                 dt_bias: torch.Tensor | None = None, use_beta_sigmoid_in_kernel: bool = False,
                 allow_neg_eigval: bool = False, **fla_kwargs) -> Support:
    """Whether :func:`~cake_gdn_det_train.chunk_gated_delta_rule_det` serves this call
    (same arguments): ``Support(True, "")``, or ``Support(False, reason)`` with the message
    of the ``ValueError`` the entry would raise. Runs the entry's checks only (with
    ``cu_seqlens`` they read its values, one host sync, as the entry does); allocates no
    output and launches nothing. Never raises ``ValueError``.

    Example: ``s = is_supported(q, k, v, g, beta, cu_seqlens=cu)``, then ``if not s:
    print(s.reason)``.
    """
    return support_of(lambda: entry_checks(
        DET, _ENTRY, q, k, v, g, beta, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, plan, use_gate_in_kernel, A_log, dt_bias,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, fla_kwargs, convert_state=False))


def workspace_bytes(plan: GDNDetPlan, device: torch.device | str | None = None, *,
                    num_v_heads: int, max_tokens: int, max_seqs: int = 1,
                    dtype: torch.dtype = torch.float32) -> int:
    """The bytes ``GDNDetWorkspace.for_plan(plan, device, num_v_heads=..., max_tokens=...,
    max_seqs=..., dtype=...)`` allocates (w, u, v_new ``[max_tokens, HV, *]`` and h ``[nc,
    HV, K, V]`` in the intermediates' dtype), computed without allocating. ``device`` is
    optional (checked when given).

    Raises:
        ValueError: as ``for_plan``.

    Example: ``workspace_bytes(make_plan(128, 128, torch.bfloat16, "cuda"), num_v_heads=32,
    max_tokens=32768, max_seqs=8)``.
    """
    return workspace_bytes_for(GDNDetWorkspace, plan, device, num_v_heads=num_v_heads,
                               max_tokens=max_tokens, max_seqs=max_seqs, dtype=dtype)


def saved_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, scale: float | None = None,
                initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                use_qk_l2norm_in_kernel: bool = False, cu_seqlens: torch.Tensor | None = None,
                *, plan: GDNDetPlan | None = None, use_gate_in_kernel: bool = False,
                A_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
                use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                **fla_kwargs) -> int:
    """The bytes :func:`~cake_gdn_det_train.chunk_gated_delta_rule_det` (same arguments)
    allocates and keeps for the backward, computed from shapes, dtypes and the plan without
    running anything: A (``[B*T, HV, 64]`` in the intermediates' dtype), with the L2 norm
    the normalised q and k (``[B, T, H, K]`` in q's dtype, kept instead of the caller's q
    and k) and their rstds (fp32 ``[B, T, H]`` each), with ``plan.keep_states`` the chunk
    states h (``[max_chunks, HV, K, V]``), w, v_new and g_cumsum, the fp32 copy of a 16-bit
    ``initial_state`` and the device copy of ``cu_seqlens`` (int64 ``[N + 1]``, in one
    storage with the chunk tables) when it is not the caller's tensor. The caller's tensors
    are not counted (the backward keeps those it reads). The checks are the entry's, which
    refuse meta tensors (a device kernels can launch on is needed).

    Raises:
        ValueError: as the entry.

    Example: ``saved_bytes(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)``.
    """
    return saved_bytes_for(DET, _ENTRY, q, k, v, g, beta, scale, initial_state,
                           output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, plan,
                           use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                           allow_neg_eigval, fla_kwargs)


def workspace_bytes_for(workspace_type: type, plan, device, *, num_v_heads: int,
                        max_tokens: int, max_seqs: int, dtype: torch.dtype) -> int:
    """:func:`workspace_bytes` of ``workspace_type.for_plan`` (its plan type)."""
    if device is not None:
        from cake_core.checks import check_alloc_device

        check_alloc_device(device)
    layout, _ = workspace_layout(workspace_type.plan_type, plan, num_v_heads, max_tokens,
                                 max_seqs, dtype)
    return nbytes_of(layout.values())


def saved_bytes_for(types: ModeTypes, entry: str, q, k, v, g, beta, scale, initial_state,
                    output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, plan,
                    use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                    allow_neg_eigval, fla_kwargs) -> int:
    """:func:`saved_bytes` of the autograd entry ``entry`` of ``types``."""
    _, (_, N, _, _, _, _, plan, seqs) = entry_checks(
        types, entry, q, k, v, g, beta, scale, initial_state, output_final_state,
        use_qk_l2norm_in_kernel, cu_seqlens, plan, use_gate_in_kernel, A_log, dt_bias,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, fla_kwargs, convert_state=False)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT, f32 = B * T, torch.float32
    idt = inter_dtype(plan, q.dtype)
    shapes = [((NT, HV, CHUNK_SIZE), idt)]  # A (T), always kept
    if use_qk_l2norm_in_kernel:
        shapes += [((B, T, H, K), q.dtype)] * 2 + [((B, T, H), f32)] * 2
    if plan.keep_states:  # g_cumsum, h (the custom op's max_chunks rows), w, v_new
        shapes += [((NT, HV), f32), ((max_chunks(NT, N), HV, K, V), idt), ((NT, HV, K), idt),
                   ((NT, HV, V), idt)]
    if initial_state is not None and initial_state.dtype != f32:  # the entry's fp32 copy
        shapes.append(((N, HV, K, V), f32))
    total = nbytes_of(shapes)
    if cu_seqlens is not None and seqs is not None:
        total += cu_storage_bytes(seqs.cu, cu_seqlens)
    return total


def cu_storage_bytes(cu: torch.Tensor, cu_seqlens: torch.Tensor) -> int:
    """Bytes of the storage of the call's device offsets ``cu`` (one upload with the chunk
    tables) that the saved set keeps, 0 when it is the caller's ``cu_seqlens``'s."""
    s = cu.untyped_storage()
    return 0 if s.data_ptr() == cu_seqlens.untyped_storage().data_ptr() else s.nbytes()
