"""GDNDetSavedSet and GDNDetWorkspace (modes checked through cake_core)."""

from __future__ import annotations

from typing import ClassVar

import torch
from cake_core import Mode, SavedSet, Workspace, check_float_dtype, check_int
from cake_core.checks import check_alloc_device
from cake_core.linear_attention import inter_dtype
from cake_core.varlen import max_chunks as _max_chunks

from cake_gdn_det_train.plan import CHUNK_SIZE, GDNDetPlan


class GDNDetSavedSet(SavedSet):
    """What the det forward keeps for the backward (:func:`chunk_gdn_det_bwd` recomputes
    w, u, the chunk states and v_new from these, unless the forward kept them:
    ``plan.keep_states``).

    Tensors (token dims flattened: ``NT = B * T``):
        q, k: ``[B, T, H, K]`` as given, or with the L2 norm (``use_qk_l2norm``) its
            outputs, q and k normalised (fresh tensors of q's dtype: the norm's backward
            needs only them and the rstds, as FLA's). v: ``[B, T, HV, V]``.
        g, beta: ``[B, T, HV]`` as given (the raw gate / pre-sigmoid beta with the in-kernel
            options; the backward recomputes the gate and sigmoid from them).
        g_cumsum: fp32 ``[NT, HV]``, the within-chunk cumulative sum of the log-decay (g, or
            the gate computed from g with ``use_gate_in_kernel``).
        A: ``[NT, HV, 64]`` (the intermediates' dtype: q's with ``plan.store_16bit`` and
            bf16/fp16 inputs, else fp32), per chunk ``(I + strictlower(beta_i k_i.k_j
            exp(G_i - G_j)))^-1`` (row i of a chunk at token i; columns past the chunk's
            length are 0).
        initial_state: fp32 ``[N, HV, K, V]`` or ``None``.
        cu_seqlens: int64 ``[N + 1]`` token offsets (built from B and T when none was given).
        q_rstd, k_rstd: fp32 ``[B, T, H]`` rsqrt(sum(x**2) + 1e-6) with the L2 norm, else
            ``None``.
        A_log, dt_bias: ``[HV]`` as given with ``use_gate_in_kernel`` (dt_bias may be
            ``None``), else ``None``.
        h, w, v_new: with ``plan.keep_states = 1`` (and at least one token), the forward's
            chunk states h ``[NC, HV, K, V]`` (the state at each chunk's start; NC = the
            64-token chunks of all sequences), w ``[NT, HV, K]`` and v_new ``[NT, HV, V]``,
            in the intermediates' dtype (as A), each a fresh tensor owned by this set (never
            a workspace's buffer); else ``None``. The backward uses them (with g_cumsum and
            A) instead of recomputing when their shapes and dtypes match and its plan is
            the forward's (``meta["plan"]``); otherwise it recomputes, same bits.
            (The autograd forward keeps g_cumsum only with them.)
    Meta: ``scale`` (float), ``use_qk_l2norm`` (bool), ``plan`` (the forward's GDNDetPlan),
    ``varlen`` (bool: cu_seqlens was given), ``use_gate_in_kernel``,
    ``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval`` (bools), ``seqs`` (the
    :class:`cake_core.varlen.SeqChunks` the forward launched with: its int64 CPU offsets
    and chunk tables, so the backward reads nothing back from the device; a backward on the
    same device and stream launches with its tables, another copies them there; ``None``
    makes the backward resolve ``cu_seqlens``). ``cu_seqlens`` is ``seqs.cu``; both may be
    shared with other calls of the same unchanged ``cu_seqlens``
    (:func:`cake_core.varlen.resolve_chunks`): read them, never modify them.
    """

    tensor_names = ("q", "k", "v", "g", "beta", "g_cumsum", "A", "initial_state", "cu_seqlens",
                    "q_rstd", "k_rstd", "A_log", "dt_bias", "h", "w", "v_new")
    # 2: with the L2 norm q and k are its outputs (the KCP sets: q, k not kept)
    format_version = 2


def workspace_shapes(plan: GDNDetPlan, HV: int) -> dict[str, tuple[int, ...]]:
    """Buffer name -> trailing dims (after the token or chunk dim) of a GDNDetWorkspace for
    ``plan`` and ``HV`` value heads."""
    K, V = plan.head_k_dim, plan.head_v_dim
    return {"w": (HV, K), "u": (HV, V), "v_new": (HV, V), "h": (HV, K, V)}


class GDNDetWorkspace(Workspace):
    """Scratch of the forward (and of the backward's recompute) for one plan, sized for
    a token and sequence capacity.

    Buffers (``cap = max_tokens``, ``nc`` = the most chunks ``max_seqs`` sequences of
    ``max_tokens`` tokens in all can form): ``w`` ``[cap, HV, K]``, ``u`` and ``v_new``
    ``[cap, HV, V]``, ``h`` ``[nc, HV, K, V]`` (the state at each chunk's start), in the
    intermediates' dtype (the inputs' dtype for bf16/fp16 inputs with ``plan.store_16bit``,
    else fp32; a workspace serves calls of that input dtype only). A call
    uses the leading part; contents are overwritten each call (no state carries over), and
    nothing in it is needed after the call returns, so one workspace can serve many calls
    (with ``plan.keep_states = 1`` the forward writes w, v_new and h to fresh tensors that
    its saved set keeps, and uses only ``u`` here).
    Not in it: the outputs and gradients, and the backward's own buffers (dh, dv_new, the
    fp32 per-value-head dq / dk, the chunk prep's g_cumsum and T when recomputed, and
    ``local_form = 2``'s z rows, partial dT and row sums), allocated per call as FLA
    does. Every element a kernel reads from them was written earlier in the same call, and
    the partials are added in a fixed order by the kernel that reads them, so no buffer's
    earlier contents reach a result.
    Build with :meth:`for_plan`.
    """

    #: the plan class :meth:`for_plan` takes (exactly: not a subclass of another mode)
    plan_type: ClassVar[type[GDNDetPlan]] = GDNDetPlan

    @classmethod
    def for_plan(cls, plan: GDNDetPlan, device: torch.device | str, *, num_v_heads: int,
                 max_tokens: int, max_seqs: int = 1,
                 dtype: torch.dtype = torch.float32) -> GDNDetWorkspace:
        """Allocate the buffers for calls of ``plan`` with ``num_v_heads`` (HV) value heads,
        at most ``max_tokens`` tokens (B * T), at most ``max_seqs`` sequences and inputs
        (q, k, v) of ``dtype``.

        Raises:
            ValueError: a plan of another type, counts that are not ints (HV, max_seqs >= 1,
                max_tokens >= 0), ``dtype`` not fp32/bf16/fp16."""
        device = check_alloc_device(device)
        layout, (HV, cap, nc) = workspace_layout(cls.plan_type, plan, num_v_heads, max_tokens,
                                                 max_seqs, dtype)
        bufs = {name: torch.empty(shape, dtype=dt, device=device)
                for name, (shape, dt) in layout.items()}
        ws = cls(plan, device, bufs)
        ws.num_v_heads, ws.max_tokens, ws.max_chunks = HV, cap, nc
        return ws


def workspace_layout(plan_type: type, plan: GDNDetPlan, num_v_heads: int, max_tokens: int,
                     max_seqs: int, dtype: torch.dtype):
    """The checks of :meth:`GDNDetWorkspace.for_plan` (but the device's) and its buffers:
    ``({name: (shape, dtype)}, (HV, max_tokens, max_chunks))``, what ``for_plan`` allocates
    and ``workspace_bytes`` counts."""
    if type(plan) is not plan_type:
        raise ValueError(f"plan: expected {plan_type.__name__}, got {type(plan).__name__}")
    check_float_dtype(dtype)
    HV = check_int(num_v_heads, "num_v_heads", 1)
    cap = check_int(max_tokens, "max_tokens", 0)
    seqs = check_int(max_seqs, "max_seqs", 1)
    nc = max_chunks(cap, seqs)
    idt = inter_dtype(plan, dtype)
    layout = {name: ((nc if name == "h" else cap, *shape), idt)
              for name, shape in workspace_shapes(plan, HV).items()}
    return layout, (HV, cap, nc)


def max_chunks(num_tokens: int, num_seqs: int) -> int:
    """The most 64-token chunks ``num_seqs`` sequences of ``num_tokens`` tokens can form
    (:func:`cake_core.varlen.max_chunks` with GDN's chunk size)."""
    return _max_chunks(num_tokens, num_seqs, CHUNK_SIZE)


__all__ = ["GDNDetSavedSet", "GDNDetWorkspace", "Mode", "max_chunks", "workspace_layout",
           "workspace_shapes"]
