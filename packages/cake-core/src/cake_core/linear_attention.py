"""Host-side pieces shared by the chunked linear-attention families (GDN, KDA).

Both follow FLA's ``chunk_gated_delta_rule`` / ``chunk_kda`` argument conventions: q, k
``[B, T, H, K]``, v ``[B, T, HV, V]`` (HV a multiple of H: GVA), a log decay g per value
head (GDN) or per value head and key channel (KDA), beta ``[B, T, HV]``, an fp32 state
``[N, HV, K, V]`` per sequence, packed sequences through ``cu_seqlens``, the in-kernel
options (q/k L2 norm, gate, beta sigmoid, ``allow_neg_eigval``), and plans keyed by the
head dims (K, V). This module holds what their entries do alike on the host, before any
allocation or launch: the argument checks (in FLA's order, messages naming the argument),
the plan and workspace resolution, the beta mode, the saved set's metadata (with the
call's sequences, resolved once: :func:`cake_core.varlen.resolve_chunks`); and the
token-by-token float64-capable
recurrence both references (the specs their kernels meet) run after their own gate. Plain
torch: importing it imports no Triton (the checks that need the backend rule import
:mod:`cake_core.triton_utils` when they run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cake_core.checks import (
    FLOAT_DTYPES,
    check_cu_seqlens,
    check_device,
    check_dtype,
    check_flag,
    check_float_dtype,
    check_int,
    check_ndim,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
)
from cake_core.layer_utils import kept_states_plan
from cake_core.mode import Mode, require_mode
from cake_core.plan import Plan, cached_plan
from cake_core.varlen import SeqChunks, resolve_chunks

__all__ = [
    "FLA_COMPAT_KEYWORDS",
    "L2NORM_EPS",
    "LAYOUTS",
    "autograd_cu_seqlens",
    "beta_code",
    "check_cu_seqlens_position",
    "check_device_and_state",
    "check_fla_compat",
    "check_gate_params",
    "check_grad_outputs",
    "check_options",
    "check_qkv_g_beta",
    "delta_rule_reference",
    "disable_recompute_plan",
    "inter_dtype",
    "l2norm_reference",
    "make_head_plan",
    "resolve_for_backward",
    "resolve_plan",
    "resolve_scale",
    "resolve_workspace",
    "saved_chunks",
    "saved_meta",
]

#: eps of FLA's q/k L2 norm (``use_qk_l2norm_in_kernel``): ``x * rsqrt(sum(x**2) + eps)``;
#: :mod:`cake_core.l2norm`'s kernel uses it too.
L2NORM_EPS = 1e-6

# ----------------------------------------------------------------------------- input checks

def _fla(dims: str, head_first: str) -> str:
    return f"{dims}, FLA's layout; head-first {head_first} is not served"


#: the layouts the input checks name in their messages: FLA's token-major ones (``T``
#: before the heads); head-first inputs (``[B, H, T, K]``, FLA's old ``head_first=True``)
#: are not served
LAYOUTS = {
    "q": _fla("[B, T, H, K]", "[B, H, T, K]"),
    "k": _fla("[B, T, H, K]", "[B, H, T, K]"),
    "v": _fla("[B, T, HV, V]", "[B, HV, T, V]"),
    "g": _fla("[B, T, HV]", "[B, HV, T]"),
    "g_per_channel": _fla("[B, T, HV, K]", "[B, HV, T, K]"),
    "beta": _fla("[B, T, HV]", "[B, HV, T]"),
    "do": _fla("[B, T, HV, V] like o", "[B, HV, T, V]"),
    "state": "[N, HV, K, V]: one fp32 state per sequence, FLA's layout",
}



def check_qkv_g_beta(q: object, k: object, v: object, g: object, beta: object, *,
                     max_head_dim: int, per_channel_decay: bool) -> tuple[int, ...]:
    """Check q, k, v, g and beta in this order; return ``(B, T, H, K, HV, V)``.

    q: a 4-D ``[B, T, H, K]`` fp32/bf16/fp16 tensor, ``H >= 1``, ``1 <= K <= max_head_dim``;
    k: ``[B, T, H, K]`` of q's dtype; v: ``[B, T, HV, V]`` of q's dtype, ``HV`` a positive
    multiple of ``H``, ``1 <= V <= max_head_dim``; g: ``[B, T, HV, K]`` with
    ``per_channel_decay`` (KDA), else ``[B, T, HV]`` (GDN), fp32 or q's dtype; beta:
    ``[B, T, HV]``, fp32 or q's dtype.

    Raises:
        ValueError: naming the first argument that breaks a rule.
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")):
        check_tensor(t, name)
    check_ndim(q, "q", ndim=4, layout=LAYOUTS["q"])
    B, T, H, K = q.shape
    if H < 1:
        raise ValueError(f"q: expected at least one head ({LAYOUTS['q']}), got shape "
                         f"{list(q.shape)}")
    if not 1 <= K <= max_head_dim:
        raise ValueError(f"q: head dim K must be in [1, {max_head_dim}], got {K}")
    check_dtype(q, "q", FLOAT_DTYPES)
    check_shape(k, "k", [B, T, H, K], layout=LAYOUTS["k"])
    check_dtype(k, "k", (q.dtype,))
    check_ndim(v, "v", ndim=4, layout=LAYOUTS["v"])
    check_shape(v, "v", [B, T, None, None], layout=LAYOUTS["v"])
    HV, V = v.shape[2], v.shape[3]
    if HV < 1 or HV % H:
        raise ValueError(f"v: value heads HV = {HV} must be a positive multiple of the q/k "
                         f"heads H = {H}")
    if not 1 <= V <= max_head_dim:
        raise ValueError(f"v: head dim V must be in [1, {max_head_dim}], got {V}")
    check_dtype(v, "v", (q.dtype,))
    check_shape(g, "g", [B, T, HV, K] if per_channel_decay else [B, T, HV],
                layout=LAYOUTS["g_per_channel" if per_channel_decay else "g"])
    check_dtype(g, "g", (torch.float32, q.dtype))
    check_shape(beta, "beta", [B, T, HV], layout=LAYOUTS["beta"])
    check_dtype(beta, "beta", (torch.float32, q.dtype))
    return B, T, H, K, HV, V


def resolve_scale(scale: object, head_k_dim: int) -> float:
    """``head_k_dim ** -0.5`` when ``scale`` is ``None`` (FLA's default), else ``scale`` as a
    float after :func:`~cake_core.check_positive_finite`."""
    return float(head_k_dim) ** -0.5 if scale is None else check_positive_finite(scale, "scale")


def check_options(output_final_state: object, use_qk_l2norm_in_kernel: object,
                  use_gate_in_kernel: object, use_beta_sigmoid_in_kernel: object,
                  allow_neg_eigval: object, **more_flags: object) -> None:
    """Each option is a real ``bool`` (:func:`~cake_core.check_flag`; the named ones in this
    order, then ``more_flags`` in the order given), and ``allow_neg_eigval`` needs
    ``use_beta_sigmoid_in_kernel`` (as FLA).

    Raises:
        ValueError: naming the first option that breaks a rule.
    """
    flags = {"output_final_state": output_final_state,
             "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
             "use_gate_in_kernel": use_gate_in_kernel,
             "use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel,
             "allow_neg_eigval": allow_neg_eigval, **more_flags}
    for name, flag in flags.items():
        check_flag(flag, name)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (the "
                         "kernel then uses beta' = 2 * sigmoid(beta), as FLA)")


#: FLA keywords the cake entry points accept for drop-in calls: speed hints they ignore
#: (cake reads ``cu_seqlens`` and builds its chunk tables itself), options accepted at
#: FLA's default value only, and ``disable_recompute``, a flag the entries read
#: (:func:`disable_recompute_plan`). Values: the allowed value, ``...`` for any, or
#: ``bool`` for a flag (any value with a truth value, tested by truthiness as FLA does).
FLA_COMPAT_KEYWORDS = {
    "cu_seqlens_cpu": ..., "chunk_indices": ..., "use_graph": ..., "max_num_seqs": ...,
    "disable_recompute": bool, "chunk_size": 64, "state_v_first": False,
    "transpose_state_layout": False, "head_first": False, "cp_context": None,
    "return_intermediate_states": False,
}

_FLA_COMPAT_WHY = {
    "chunk_size": "cake's chunk size is fixed at 64 (the plan's chunk_size)",
    "state_v_first": "cake's states are [N, HV, K, V] (FLA's default layout); transpose "
                     "initial_state / final_state yourself",
    "transpose_state_layout": "cake's states are [N, HV, K, V] (FLA's default layout)",
    "head_first": "inputs are [B, T, H, ...] (FLA 0.6.0 refuses head_first altogether)",
    "cp_context": "context parallelism is the separate *-kcp package",
    "return_intermediate_states": "cake returns (o, final_state) only",
}


def check_fla_compat(fla_kwargs: dict[str, object], entry: str,
                     accepted: tuple[str, ...] = tuple(FLA_COMPAT_KEYWORDS)) -> None:
    """Accept FLA's extra keywords of ``entry`` (a drop-in for FLA's function): the speed
    hints of :data:`FLA_COMPAT_KEYWORDS` (ignored), the options at FLA's default value
    (flags off by truthiness, as FLA tests them; ``head_first`` is refused by FLA 0.6.0
    whatever its value, accepted here when off) and ``disable_recompute`` at any value
    with a truth value (the entry reads it: :func:`disable_recompute_plan`).

    Raises:
        TypeError: a keyword not in ``accepted`` (FLA's functions take ``**kwargs`` and
            ignore unknown names; cake says so instead, as Python would).
        ValueError: an option at a value cake does not implement, saying why; a flag
            without a truth value (an array of several elements).
    """
    for name, value in fla_kwargs.items():
        if name not in accepted:
            raise TypeError(f"{entry}() got an unexpected keyword argument {name!r}")
        want = FLA_COMPAT_KEYWORDS[name]
        if want is ...:
            continue
        if want is bool:  # a flag the entry reads, by truthiness as FLA
            try:
                bool(value)
            except (TypeError, ValueError, RuntimeError) as e:  # arrays, other non-scalars
                raise ValueError(f"{name}={value!r}: expected a flag (FLA tests it by "
                                 f"truthiness)") from e
            continue
        try:
            if want is None:
                same = value is None
            elif want is False:  # FLA tests these flags by truthiness: None, 0 are off
                same = not bool(value)
            else:  # chunk_size: an int-valued number (64, 64.0, a 0-d tensor), not a bool
                same = not isinstance(value, bool) and int(value) == want == float(value)
        except (TypeError, ValueError, RuntimeError):  # arrays and other non-scalars
            same = False
        if not same:
            raise ValueError(f"{name}={value!r} is not supported ({_FLA_COMPAT_WHY[name]}); "
                             f"only {name}={want!r}, FLA's default, is accepted")


def disable_recompute_plan(plan: Plan, given: object, cache: dict) -> Plan:
    """The plan a call with FLA's ``disable_recompute=True`` runs: the forward keeps the
    chunk states for the backward, which then skips their recompute (cake's plan field
    ``keep_states = 1``). ``plan``: the call's plan as the entry resolved it, ``given``:
    the caller's (``None``: ``plan`` is the rule's). Returns ``plan`` when it keeps the
    states already, else the rule's plan with ``keep_states = 1``, made once per plan and
    kept in ``cache`` (the entry's, one per package and mode:
    :func:`cake_core.layer_utils.kept_states_plan`).

    Raises:
        ValueError: ``given`` is a plan with ``keep_states = 0``.
    """
    if plan.keep_states:
        return plan
    if given is not None:
        raise ValueError("disable_recompute=True: the plan given has keep_states=0 (its "
                         "backward recomputes the chunk states); pass a plan with "
                         "keep_states=1 (dataclasses.replace(plan, keep_states=1)) or drop "
                         "disable_recompute")
    return kept_states_plan(cache, plan)


def check_cu_seqlens_position(cu_seqlens: object) -> None:
    """A bool where ``cu_seqlens`` goes is an FLA positional call: cake's 10th positional
    argument is ``cu_seqlens``, FLA's a flag (``use_beta_sigmoid_in_kernel`` in
    ``chunk_gated_delta_rule``, ``use_gate_in_kernel`` in ``chunk_kda``).

    Raises:
        ValueError: ``cu_seqlens`` is a bool.
    """
    if isinstance(cu_seqlens, bool):
        raise ValueError("cu_seqlens: got a bool; the 10th positional argument is cu_seqlens "
                         "here (in FLA's function it is a flag): pass FLA's flags by keyword")


def check_gate_params(dtype: torch.dtype,
                      *params: tuple[object, str, list[int]]) -> None:
    """Each ``(tensor, name, shape)`` whose tensor is not ``None`` (an in-kernel gate's
    ``A_log`` or ``dt_bias``): a tensor of exactly ``shape``, fp32 or ``dtype`` (q's)."""
    for t, name, shape in params:
        if t is not None:
            check_tensor(t, name)
            check_shape(t, name, shape)
            check_dtype(t, name, tuple(dict.fromkeys((torch.float32, dtype))))


def check_device_and_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           g: torch.Tensor, beta: torch.Tensor, initial_state: object,
                           cu_seqlens: object, A_log: torch.Tensor | None = None,
                           dt_bias: torch.Tensor | None = None, *,
                           chunk_size: int) -> tuple:
    """After :func:`check_qkv_g_beta`: every tensor on one device that the backend can
    launch on, ``cu_seqlens`` (only with ``B == 1``; its values are read, one host sync,
    once per tensor version, and not while ``torch.compile`` traces: the family's op checks
    them before launching) and ``initial_state`` (fp32 ``[N, HV, K, V]``). Returns
    ``(device, N, seqs)``: N the number of sequences, ``seqs`` the call's sequences and
    their ``chunk_size``-token chunk tables, resolved once
    (:func:`cake_core.varlen.resolve_chunks`; ``None`` while torch.compile traces).

    Raises:
        ValueError: naming the first argument that breaks a rule.
    """
    from cake_core.triton_utils import launch_device_check

    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    device = check_same_device(("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta),
                               ("initial_state", initial_state), ("A_log", A_log),
                               ("dt_bias", dt_bias))
    launch_device_check(device, "q")
    compiling = torch.compiler.is_compiling()
    seqs = None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens: packed sequences need B == 1, got B = {B}")
        # no value reads while torch.compile traces; the op checks them before launching
        if compiling:
            check_cu_seqlens(cu_seqlens, T, device, read_values=False)
        else:
            seqs = resolve_chunks(cu_seqlens, B, T, device, chunk_size)
        N = cu_seqlens.numel() - 1
    else:
        N = B
    if initial_state is not None:
        check_tensor(initial_state, "initial_state")
        check_shape(initial_state, "initial_state", [N, HV, K, V], layout=LAYOUTS["state"])
        check_dtype(initial_state, "initial_state", (torch.float32,))
    if cu_seqlens is None and not compiling:
        seqs = resolve_chunks(None, B, T, device, chunk_size)
    return device, N, seqs


def saved_chunks(saved: Any, chunk_size: int, device: torch.device) -> SeqChunks:
    """The sequences a backward of ``saved`` launches with: the forward's
    (``saved.meta["seqs"]``, :func:`cake_core.varlen.resolve_chunks`) when made for this
    chunk size, else resolved from ``saved.cu_seqlens`` (its device offsets: a cache hit
    when they are the forward's, else one read-back)."""
    seqs = saved.meta.get("seqs")
    if seqs is not None and seqs.chunk_size == chunk_size:
        return seqs
    B, T = saved.q.shape[:2]
    return resolve_chunks(saved.cu_seqlens, B, T, device, chunk_size)


def autograd_cu_seqlens(cu_seqlens: torch.Tensor | None, q: torch.Tensor,
                        chunk_size: int) -> torch.Tensor | None:
    """What a family's registered autograd saves for ``cu_seqlens`` (its ``setup_context``,
    right after the fwd op ran): eagerly, the device offsets of the call's
    :class:`~cake_core.varlen.SeqChunks` (the op's, found in the cache), so that the bwd op
    resolves them to the forward's very object and launches with the forward's tables,
    whatever happens to the caller's tensor; while traced (fake tensors), or without
    ``cu_seqlens``, the argument itself."""
    if cu_seqlens is None or type(q) is not torch.Tensor or torch.compiler.is_compiling():
        return cu_seqlens
    B, T = q.shape[:2]
    return resolve_chunks(cu_seqlens, B, T, q.device, chunk_size).cu


def check_grad_outputs(do: object, dht: object, saved: Any) -> torch.device:
    """The low-level backward's checks of the upstream gradients against the forward's saved
    set (its ``q``, ``v`` and ``cu_seqlens``): ``do`` like o (``[B, T, HV, V]``,
    fp32/bf16/fp16), ``dht`` ``None`` or fp32 ``[N, HV, K, V]``, both on the saved set's
    device, which the backend can launch on. Returns that device."""
    from cake_core.triton_utils import launch_device_check

    v = saved.v
    K = saved.q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    N = saved.cu_seqlens.numel() - 1
    check_tensor(do, "do")
    check_shape(do, "do", list(v.shape), layout=LAYOUTS["do"])
    check_dtype(do, "do", FLOAT_DTYPES)
    if dht is not None:
        check_tensor(dht, "dht")
        check_shape(dht, "dht", [N, HV, K, V], layout=LAYOUTS["state"])
        check_dtype(dht, "dht", (torch.float32,))
    device = check_same_device(("saved", v), ("do", do), ("dht", dht))
    launch_device_check(device, "do")
    return device


# ----------------------------------------------------------------------------- plans


def make_head_plan(head_k_dim: object, head_v_dim: object, dtype: object, device: object, *,
                   max_head_dim: int, rule: Callable[[int, int, torch.dtype, torch.device], Plan],
                   cuda_plan_problem: Callable[[Plan, torch.dtype], str | None],
                   cache: dict,
                   fit_shared_memory: Callable[[Plan, int], Plan] | None = None) -> Plan:
    """The body of a family's ``make_plan(head_k_dim, head_v_dim, dtype, device)``.

    Checks the arguments (device first, then K and V as ints in ``[1, max_head_dim]``, then
    the dtype), returns ``rule(K, V, dtype, device)`` memoised in ``cache`` per
    ``(K, V, dtype, device type, shared memory)`` (:func:`cake_core.plan.cached_plan`), and
    on CUDA refuses a plan that ``cuda_plan_problem(plan, dtype)`` says cannot run.
    ``fit_shared_memory(plan, smem)``: the family's rule for a CUDA device with ``smem``
    bytes of shared memory per block (:func:`rule_shared_memory`), applied to the rule's
    plan (fewer stages where the plan's would not fit).

    Raises:
        ValueError: ``device: ...``, ``head_k_dim: ...``, ``head_v_dim: ...``,
            ``dtype: ...``, or ``make_plan(K=.., V=.., dtype): <problem>``.
    """
    device = check_device(device)
    K = check_int(head_k_dim, "head_k_dim", 1, max_head_dim)
    V = check_int(head_v_dim, "head_v_dim", 1, max_head_dim)
    check_float_dtype(dtype)
    smem = rule_shared_memory(device)

    def make() -> Plan:
        plan = rule(K, V, dtype, device)
        if fit_shared_memory is not None and device.type == "cuda":
            plan = fit_shared_memory(plan, smem)
        return plan

    plan = cached_plan(cache, (K, V, dtype, device.type, smem), make)
    if device.type == "cuda":
        problem = cuda_plan_problem(plan, dtype)
        if problem is not None:
            raise ValueError(f"make_plan(K={K}, V={V}, {dtype}): {problem}")
    return plan


def rule_shared_memory(device: torch.device) -> int:
    """:func:`cake_core.triton_utils.rule_shared_memory`, the input of
    :func:`make_head_plan`'s ``fit_shared_memory`` (a module attribute: tests patch it)."""
    from cake_core.triton_utils import rule_shared_memory as smem  # imports Triton

    return smem(device)


def resolve_plan(plan: object, K: int, V: int, dtype: torch.dtype, device: torch.device, *,
                 plan_type: type[Plan], make_plan: Callable[..., Plan],
                 cuda_plan_problem: Callable[[Plan, torch.dtype], str | None],
                 cache: dict, mode: Mode = Mode.DET) -> Plan:
    """The plan a call runs: ``make_plan(K, V, dtype, device)`` when ``plan`` is ``None``
    (memoised in ``cache`` per ``(K, V, dtype, device)``), else the caller's after
    :func:`~cake_core.require_mode` (``plan_type``, ``mode``: the entry's), a head-dims
    check and, on CUDA, ``cuda_plan_problem``.

    Raises:
        ValueError: ``plan: ...`` naming what is wrong.
    """
    if plan is None:
        return cached_plan(cache, (K, V, dtype, device), lambda: make_plan(K, V, dtype, device))
    require_mode(plan, plan_type, mode, name="plan")
    if (plan.head_k_dim, plan.head_v_dim) != (K, V):
        raise ValueError(f"plan: made for K={plan.head_k_dim}, V={plan.head_v_dim}; inputs have "
                         f"K={K}, V={V}")
    if device.type == "cuda":
        problem = cuda_plan_problem(plan, dtype)
        if problem is not None:
            raise ValueError(f"plan: {problem}")
    return plan


def inter_dtype(plan: Plan, dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the chunk intermediates (and of a workspace's buffers): the inputs'
    ``dtype`` for bf16/fp16 inputs when ``plan.store_16bit``, else fp32."""
    return dtype if plan.store_16bit and dtype != torch.float32 else torch.float32


# ----------------------------------------------------------------------------- workspaces


def resolve_workspace(workspace: object, plan: Plan, device: torch.device, *,
                      workspace_type: type, buffer_shapes: dict[str, tuple[int, ...]],
                      buffer_dtype: torch.dtype, tokens: int, chunks: int,
                      chunk_buffers: tuple[str, ...] = ("h",), mode: Mode = Mode.DET):
    """``None``, or the caller's workspace after every check: type and ``mode`` (the
    entry's; :func:`~cake_core.require_mode`), plan and device (:meth:`Workspace.check`), each
    buffer of ``buffer_shapes`` (name -> dims after the leading token or chunk dim) present,
    contiguous and of ``buffer_dtype``, and room for ``tokens`` tokens (every buffer not in
    ``chunk_buffers``) and ``chunks`` chunks.

    Raises:
        ValueError: ``workspace: ...`` naming what is wrong.
    """
    if workspace is None:
        return None
    require_mode(workspace, workspace_type, mode, name="workspace")
    workspace.check(plan, device)
    for name, shape in buffer_shapes.items():
        t = workspace[name] if name in workspace.names else None
        if t is None or t.dtype != buffer_dtype or not t.is_contiguous() or \
                t.dim() != len(shape) + 1 or tuple(t.shape[1:]) != shape:
            raise ValueError(
                f"workspace: buffer {name!r} must be a contiguous {buffer_dtype} tensor of "
                f"shape [*, {', '.join(map(str, shape))}]; build it with "
                f"{workspace_type.__name__}.for_plan(plan, device, num_v_heads=HV, "
                "max_tokens=..., max_seqs=..., dtype=q.dtype)")
    cap_t = min(workspace[n].shape[0] for n in buffer_shapes if n not in chunk_buffers)
    cap_c = min(workspace[n].shape[0] for n in chunk_buffers)
    if tokens > cap_t or chunks > cap_c:
        raise ValueError(f"workspace: holds {cap_t} tokens and {cap_c} chunks, the call needs "
                         f"{tokens} and {chunks}")
    return workspace


def resolve_for_backward(saved: Any, plan: object, workspace: object, device: torch.device,
                         *, resolve_plan: Callable[..., Plan], resolve_workspace: Callable,
                         chunk_size: int) -> tuple[Plan, Any]:
    """``(plan, workspace)`` a low-level backward of ``saved`` runs with: the family's
    ``resolve_plan(plan or saved.plan, K, V, dtype, device)`` for the saved q/v head dims,
    and ``resolve_workspace(workspace, plan, device, HV, tokens, chunks, dtype)`` for the
    saved tokens and their ``chunk_size``-token chunks (:func:`saved_chunks`)."""
    B, T, _, K = saved.q.shape
    HV, V = saved.v.shape[2], saved.v.shape[3]
    dtype = saved.q.dtype
    plan = resolve_plan(plan if plan is not None else saved.plan, K, V, dtype, device)
    NC = saved_chunks(saved, chunk_size, device).num_chunks
    return plan, resolve_workspace(workspace, plan, device, HV, B * T, NC, dtype)


# ----------------------------------------------------------------------------- saved sets


def beta_code(use_sigmoid: bool, allow_neg_eigval: bool) -> int:
    """How the kernels read beta: 0 as given; 1 ``sigmoid(beta)``; 2 ``2 * sigmoid(beta)``
    (FLA's ``allow_neg_eigval``)."""
    return (2 if allow_neg_eigval else 1) if use_sigmoid else 0


def saved_meta(*, scale: float, use_qk_l2norm: bool, plan: Plan, varlen: bool,
               use_gate_in_kernel: bool, beta: int, seqs: SeqChunks | None,
               **extra: Any) -> dict[str, Any]:
    """The metadata a forward keeps beside its saved tensors: ``scale``, ``use_qk_l2norm``,
    ``plan``, ``varlen`` (``cu_seqlens`` was given), ``use_gate_in_kernel``,
    ``use_beta_sigmoid_in_kernel`` and ``allow_neg_eigval`` (from the :func:`beta_code`
    ``beta``), ``seqs`` (the :class:`cake_core.varlen.SeqChunks` the forward launched with:
    its host offsets and chunk tables, which a backward reuses, :func:`saved_chunks`;
    ``None``: the backward resolves ``cu_seqlens``) and the family's ``extra`` entries."""
    return {"scale": scale, "use_qk_l2norm": use_qk_l2norm, "plan": plan, "varlen": varlen,
            "use_gate_in_kernel": use_gate_in_kernel, "use_beta_sigmoid_in_kernel": bool(beta),
            "allow_neg_eigval": beta == 2, "seqs": seqs, **extra}


# ----------------------------------------------------------------------------- references


def l2norm_reference(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x * rsqrt(sum(x**2, -1) + eps)`` in x's dtype (differentiable)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def delta_rule_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None,
                         initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False,
                         cu_seqlens: torch.Tensor | None = None, *,
                         dtype: torch.dtype | None = None,
                         gate: Callable[[torch.Tensor], torch.Tensor] | None = None,
                         use_beta_sigmoid_in_kernel: bool = False,
                         allow_neg_eigval: bool = False,
                         use_qk_l2norm_in_kernel: bool = False):
    """The gated delta rule one token at a time, in plain torch (slow; the core of the
    families' references). Per sequence and value head, state ``S`` ``[K, V]``::

        S <- diag(exp(g_t)) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T
        o_t = scale S^T q_t

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``, HV a multiple of H; value head ``j``
            reads q/k head ``j // (HV // H)``.
        g: the log decay, ``[B, T, HV]`` (one per value head: GDN) or ``[B, T, HV, K]``
            (one per key channel: KDA), or the raw gate that ``gate`` turns into it.
        beta: ``[B, T, HV]`` (pre-sigmoid with ``use_beta_sigmoid_in_kernel``).
        scale: output scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` or ``None`` (zeros), N sequences.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: ``[N + 1]`` offsets of packed sequences (then B == 1), or ``None``
            (N = B sequences of T tokens).
        dtype: compute dtype (default q's dtype; ``torch.float64`` for a reference).
        gate: the family's in-kernel gate, applied to g (cast to ``dtype``), or ``None``.
        use_beta_sigmoid_in_kernel, allow_neg_eigval: ``sigmoid(beta)`` (``2 *
            sigmoid(beta)``) is used, as FLA.
        use_qk_l2norm_in_kernel: q and k pass through :func:`l2norm_reference` first.

    Order, as the kernels: inputs cast to ``dtype``, the gate, the beta sigmoid, the L2
    norm. Returns ``(o, final_state)``: o ``[B, T, HV, V]`` and the ``[N, HV, K, V]`` final
    states (``None`` without ``output_final_state``), both in ``dtype``; differentiable.
    """
    dtype = dtype or q.dtype
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if gate is not None:
        g = gate(g)
    if use_beta_sigmoid_in_kernel:
        beta = (2.0 if allow_neg_eigval else 1.0) * torch.sigmoid(beta)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_reference(q), l2norm_reference(k)
    # value head j uses q/k head j // group
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    per_channel = g.dim() == 4
    # (first row, rows, first token, end): the B sequences of an unpacked batch run together
    # (one token loop), the documents of a packed one one after another
    if cu_seqlens is None:
        spans = [(0, B, 0, T)]
    else:
        cu = [int(x) for x in cu_seqlens.tolist()]
        spans = [(n, 1, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    outs, finals = [], []
    for n, rows, bos, eos in spans:
        b = slice(0, rows)  # batch rows of q, k, v, g, beta (row 0 when packed)
        if initial_state is not None:
            S = initial_state[n:n + rows].to(dtype)
        else:
            S = torch.zeros(rows, HV, K, V, dtype=dtype, device=q.device)
        seq_out = []
        for t in range(bos, eos):
            kt, vt, qt = k[b, t], v[b, t], q[b, t]      # [rows, HV, K], [.., V], [.., K]
            decay = torch.exp(g[b, t])                 # [rows, HV] or [rows, HV, K]
            S = S * (decay[..., None] if per_channel else decay[..., None, None])
            kS = torch.einsum("bhk,bhkv->bhv", kt, S)
            u = beta[b, t][..., None] * (vt - kS)
            S = S + kt[..., None] * u[..., None, :]
            seq_out.append(scale * torch.einsum("bhk,bhkv->bhv", qt, S))
        outs.append(torch.stack(seq_out, 1) if seq_out else v.new_zeros((rows, 0, HV, V)))
        finals.append(S)
    o = torch.cat(outs, 1) if outs else v.new_zeros((1, 0, HV, V))
    final = None
    if output_final_state:
        final = torch.cat(finals) if finals else v.new_zeros((0, HV, K, V))
    return o, final
