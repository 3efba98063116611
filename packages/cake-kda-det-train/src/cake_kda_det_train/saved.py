"""KDADetSavedSet and KDADetWorkspace (modes checked through cake_core)."""

from __future__ import annotations

import torch
from cake_core import Mode, SavedSet, Workspace, check_float_dtype, check_int, require_mode
from cake_core.checks import check_alloc_device
from cake_core.varlen import max_chunks

from cake_kda_det_train.plan import CHUNK_SIZE, KDADetPlan, inter_dtype


class KDADetSavedSet(SavedSet):
    """What the det KDA forward keeps for :func:`~cake_kda_det_train.chunk_kda_det_bwd`
    (the backward recomputes w, u, kg, the chunk states and v_new from these, unless the
    forward kept them: ``plan.keep_states``).

    Tensors (``NT = B * T``):
        q, k: ``[B, T, H, K]`` as given, or with the L2 norm (``use_qk_l2norm``) its
            outputs, q and k normalised (fresh tensors of q's dtype: the norm's backward
            needs only them and the rstds, as FLA's). v: ``[B, T, HV, V]``.
        g: ``[B, T, HV, K]`` as given (the raw gate with ``use_gate_in_kernel``: the
            backward recomputes the gate's derivative from it).
        beta: ``[B, T, HV]`` as given (pre-sigmoid with ``use_beta_sigmoid_in_kernel``).
        g_cumsum: fp32 ``[NT, HV, K]``, the within-chunk (64 tokens, per sequence)
            cumulative sum of the per-token log decay (g, or the gate computed from it).
        A: ``[2, NT, HV, 64]`` in ``plan.inter_dtype(plan, q.dtype)``: each chunk's
            inverse T of the WY/UT form, then its gated ``scale q k^T`` (Aqk), which the
            backward loads instead of recomputing them (``None``, or another dtype or
            shape: the backward recomputes both).
        initial_state: fp32 ``[N, HV, K, V]`` or ``None``.
        cu_seqlens: int64 ``[N + 1]`` token offsets on the inputs' device (built from B
            and T when none was given).
        q_rstd, k_rstd: fp32 ``[B, T, H]``, ``rsqrt(sum(x**2) + 1e-6)`` with the L2 norm,
            else ``None``.
        A_log: ``[HV]`` as given with ``use_gate_in_kernel`` (``None`` otherwise, or when
            the lower-bound gate runs without it). dt_bias: ``[HV * K]`` as given with
            ``use_gate_in_kernel``, or ``None``.
        h, w, kg, v_new: with ``plan.keep_states = 1`` (and at least one token), the
            forward's chunk states h ``[NC, HV, K, V]`` (the state at each chunk's start;
            NC = the 64-token chunks of all sequences; under ``torch.compile`` the
            autograd entry's has the most chunks the sequences could form, the first NC
            being the states), w and kg (``k exp(G_last - G)``) ``[NT,
            HV, K]`` and v_new ``[NT, HV, V]``, in the intermediates' dtype (as A), each a
            fresh tensor owned by this set (never a workspace's buffer); else ``None``. The
            backward uses them (with g_cumsum and A) instead of recomputing when their
            shapes and dtypes fit and its plan is the forward's (``meta["plan"]``);
            otherwise it recomputes, with the same bits.
    Meta: ``scale`` (float), ``use_qk_l2norm`` (bool), ``plan`` (the forward's
    :class:`~cake_kda_det_train.KDADetPlan`), ``varlen`` (bool: cu_seqlens was given),
    ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval`` (bools),
    ``lower_bound`` (float or ``None``), ``seqs`` (the :class:`cake_core.varlen.SeqChunks`
    the forward launched with: its int64 CPU offsets and chunk tables, so the backward reads
    nothing back from the device; a backward on the same device and stream launches with
    its tables, another copies them there; ``None`` makes the backward resolve
    ``cu_seqlens``). ``cu_seqlens`` is ``seqs.cu``; both may be shared with other calls of
    the same unchanged ``cu_seqlens`` (:func:`cake_core.varlen.resolve_chunks`): read them,
    never modify them.
    """

    tensor_names = ("q", "k", "v", "g", "beta", "g_cumsum", "A", "initial_state", "cu_seqlens",
                    "q_rstd", "k_rstd", "A_log", "dt_bias", "h", "w", "kg", "v_new")
    # 2: with the L2 norm q and k are its outputs (the KCP sets: q, k not kept)
    format_version = 2


def workspace_shapes(plan: KDADetPlan, HV: int) -> dict[str, tuple[int, ...]]:
    """Buffer name -> trailing dims (after the token or chunk dim) of a KDADetWorkspace
    for ``plan`` and ``HV`` value heads."""
    K, V = plan.head_k_dim, plan.head_v_dim
    return {"w": (HV, K), "u": (HV, V), "v_new": (HV, V), "h": (HV, K, V),
            "aqk": (HV, CHUNK_SIZE)}


class KDADetWorkspace(Workspace):
    """Scratch of the forward (and of the backward's recompute) for one plan, sized for a
    token and sequence capacity.

    Buffers (``cap = max_tokens``, ``nc`` = the most 64-token chunks ``max_seqs`` sequences
    of ``max_tokens`` tokens in all can form), all in the chunk intermediates' dtype
    ``plan.inter_dtype(plan, dtype)`` (the inputs' dtype for bf16/fp16 inputs with
    ``plan.store_16bit``, else fp32; a workspace serves calls of that input dtype only):
    ``w`` ``[cap, HV, K]``, ``u`` and ``v_new`` ``[cap, HV, V]``, ``h`` ``[nc, HV, K, V]``
    (the state at each chunk's start), ``aqk`` ``[cap, HV, 64]`` (the chunk's gated
    ``q k^T``). A call uses the leading rows; contents are overwritten each call and nothing
    in them is needed after the call returns, so one workspace can serve many calls (not
    two at once). Build with :meth:`for_plan`.
    """

    @classmethod
    def for_plan(cls, plan: KDADetPlan, device: torch.device | str, *, num_v_heads: int,
                 max_tokens: int, max_seqs: int = 1,
                 dtype: torch.dtype = torch.float32) -> KDADetWorkspace:
        """Allocate the buffers for calls of ``plan`` with ``num_v_heads`` (HV) value heads,
        at most ``max_tokens`` tokens (B * T), at most ``max_seqs`` sequences and q/k/v of
        ``dtype``.

        Raises:
            ValueError: a plan of another type or mode, counts that are not ints
                (HV >= 1, max_tokens >= 0, max_seqs >= 1), ``dtype`` not fp32/bf16/fp16.
        """
        return allocate_workspace(cls, KDADetPlan, Mode.DET, plan, device, num_v_heads,
                                  max_tokens, max_seqs, dtype)


def allocate_workspace(cls: type, plan_type: type, mode: Mode, plan: KDADetPlan,
                       device: torch.device | str, num_v_heads: int, max_tokens: int,
                       max_seqs: int, dtype: torch.dtype):
    """The body of ``for_plan`` of :class:`KDADetWorkspace` and cake-kda-nondet-train's
    workspace: checks (``plan`` a ``plan_type`` of ``mode``), then a ``cls`` with the
    buffers of :func:`workspace_shapes`."""
    device = check_alloc_device(device)
    layout, (HV, cap, nc) = workspace_layout(plan_type, mode, plan, num_v_heads, max_tokens,
                                             max_seqs, dtype)
    bufs = {name: torch.empty(shape, dtype=dt, device=device)
            for name, (shape, dt) in layout.items()}
    ws = cls(plan, device, bufs)
    ws.num_v_heads, ws.max_tokens, ws.max_chunks = HV, cap, nc
    ws.dtype = dtype
    return ws


def workspace_layout(plan_type: type, mode: Mode, plan: KDADetPlan, num_v_heads: int,
                     max_tokens: int, max_seqs: int, dtype: torch.dtype):
    """The checks of :func:`allocate_workspace` (but the device's) and its buffers:
    ``({name: (shape, dtype)}, (HV, max_tokens, max_chunks))``, what ``for_plan``
    allocates and ``workspace_bytes`` counts."""
    require_mode(plan, plan_type, mode, name="plan")
    check_float_dtype(dtype)
    HV = check_int(num_v_heads, "num_v_heads", 1)
    cap = check_int(max_tokens, "max_tokens", 0)
    seqs = check_int(max_seqs, "max_seqs", 1)
    nc = max_chunks(cap, seqs, CHUNK_SIZE)
    idt = inter_dtype(plan, dtype)
    rows = {"w": cap, "u": cap, "v_new": cap, "h": nc, "aqk": cap}
    layout = {name: ((rows[name], *shape), idt)
              for name, shape in workspace_shapes(plan, HV).items()}
    return layout, (HV, cap, nc)


__all__ = ["KDADetSavedSet", "KDADetWorkspace", "allocate_workspace", "workspace_layout",
           "workspace_shapes"]
