"""Host-side pieces shared by the chunked linear-attention families (GDN, KDA).

Both follow FLA's ``chunk_gated_delta_rule`` / ``chunk_kda`` argument conventions: q, k
``[B, T, H, K]``, v ``[B, T, HV, V]`` (HV a multiple of H: GVA), a log decay g per value
head (GDN) or per value head and key channel (KDA), beta ``[B, T, HV]``, an fp32 state
``[N, HV, K, V]`` per sequence, packed sequences through ``cu_seqlens``, the in-kernel
options (q/k L2 norm, gate, beta sigmoid, ``allow_neg_eigval``), and plans keyed by the
head dims (K, V). This module holds what their entries do alike on the host, before any
allocation or launch: the argument checks (in FLA's order, messages naming the argument),
the plan and workspace resolution, the beta mode, the saved set's metadata, the
sequence offsets (read back once per ``cu_seqlens`` version:
:func:`cake_core.varlen.checked_offsets`) and the chunk tables built from them (kept
beside those offsets: :func:`chunk_tables_for`); and the token-by-token float64-capable
recurrence both references (the specs their kernels meet) run after their own gate. Plain
torch: importing it imports no Triton (the checks that need the backend rule import
:mod:`cake_core.triton_utils` when they run).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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
from cake_core.mode import Mode, require_mode
from cake_core.plan import Plan, cached_plan
from cake_core.varlen import (
    SeqChunks,
    checked_offsets,
    chunk_tables,
    offsets_derived,
    resolve_chunks,
    seq_offsets,
)

__all__ = [
    "FLA_COMPAT_KEYWORDS",
    "L2NORM_EPS",
    "LAYOUTS",
    "beta_code",
    "check_cu_seqlens_position",
    "check_device_and_state",
    "check_fla_compat",
    "check_gate_params",
    "check_grad_outputs",
    "check_options",
    "check_qkv_g_beta",
    "chunk_tables_for",
    "delta_rule_reference",
    "host_offsets",
    "inter_dtype",
    "l2norm_reference",
    "make_head_plan",
    "op_offsets",
    "resolve_for_backward",
    "resolve_plan",
    "resolve_scale",
    "resolve_workspace",
    "saved_chunk_tables",
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


#: FLA keywords the cake entry points accept only for compatibility: speed hints they
#: ignore (cake reads ``cu_seqlens`` and builds its chunk tables itself) and options
#: accepted at FLA's default value only. Values: the allowed value, or ``...`` for any.
FLA_COMPAT_KEYWORDS = {
    "cu_seqlens_cpu": ..., "chunk_indices": ..., "use_graph": ..., "max_num_seqs": ...,
    "disable_recompute": ..., "chunk_size": 64, "state_v_first": False,
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
    hints of :data:`FLA_COMPAT_KEYWORDS` (ignored) and the options at FLA's default value
    (flags off by truthiness, as FLA tests them; ``head_first`` is refused by FLA 0.6.0
    whatever its value, accepted here when off).

    Raises:
        TypeError: a keyword not in ``accepted`` (FLA's functions take ``**kwargs`` and
            ignore unknown names; cake says so instead, as Python would).
        ValueError: an option at a value cake does not implement, saying why.
    """
    for name, value in fla_kwargs.items():
        if name not in accepted:
            raise TypeError(f"{entry}() got an unexpected keyword argument {name!r}")
        want = FLA_COMPAT_KEYWORDS[name]
        if want is ...:
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
                           with_offsets: bool = False, chunk_size: int | None = None) -> tuple:
    """After :func:`check_qkv_g_beta`: every tensor on one device that the backend can
    launch on, ``cu_seqlens`` (only with ``B == 1``; its values are read, one host sync,
    once per tensor version (:func:`cake_core.varlen.checked_offsets`: a repeated call with
    the same unchanged tensor reads nothing back), and not while ``torch.compile`` traces:
    the family's op checks them before launching) and ``initial_state`` (fp32
    ``[N, HV, K, V]``). Returns ``(device, N)``, N the number of sequences; with
    ``with_offsets`` ``(device, N, offsets)``: the int64 CPU offsets ``[N + 1]`` (owned by
    the cache: read-only; ``None`` while torch.compile traces); with ``chunk_size``
    ``(device, N, seqs)``: the call's sequences resolved once
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
            offsets = None
        elif chunk_size is not None:
            seqs = resolve_chunks(cu_seqlens, B, T, device, chunk_size)
            offsets = seqs.offsets
        else:
            offsets = checked_offsets(cu_seqlens, T, device)
        N = cu_seqlens.numel() - 1
    else:
        N = B
        offsets = None if compiling else seq_offsets(None, B, T)
    if initial_state is not None:
        check_tensor(initial_state, "initial_state")
        check_shape(initial_state, "initial_state", [N, HV, K, V], layout=LAYOUTS["state"])
        check_dtype(initial_state, "initial_state", (torch.float32,))
    if chunk_size is not None:
        if cu_seqlens is None and not compiling:
            seqs = resolve_chunks(None, B, T, device, chunk_size)
        return device, N, seqs
    return (device, N, offsets) if with_offsets else (device, N)


def op_offsets(cu_seqlens: torch.Tensor | None, B: int, T: int,
               device: torch.device) -> torch.Tensor:
    """The int64 CPU offsets a family's custom op launches with: ``cu_seqlens``' values
    checked (before any launch; ValueError as :func:`cake_core.check_cu_seqlens`) and read
    back unless this very tensor, unchanged, was checked before
    (:func:`cake_core.varlen.checked_offsets`); ``[0, T, ..., BT]`` without it."""
    if cu_seqlens is None:
        return seq_offsets(None, B, T)
    return checked_offsets(cu_seqlens, T, device)


# ----------------------------------------------------------------------------- chunk tables

_TABLES = "cake_core.linear_attention.chunk_tables"


def _tables_key(chunk_size: int, device: torch.device) -> tuple:
    # the stream the tables are copied on: tables are only reused on their own stream (the
    # copy is ordered before the launches, and their memory is freed on the stream that
    # read them)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
    return (_TABLES, chunk_size, device, stream)


def chunk_tables_for(cu_seqlens: torch.Tensor | None, offsets: torch.Tensor, chunk_size: int,
                     device: torch.device | None = None) -> tuple:
    """The chunk tables of a call, kept with the :func:`cake_core.varlen.checked_offsets`
    entry of ``cu_seqlens`` (:func:`cake_core.varlen.offsets_derived`): a repeated call with
    the same unchanged tensor rebuilds and uploads nothing; without ``cu_seqlens``, kept by
    the offsets' values (a :data:`FIXED_TABLES_CACHE_SIZE`-entry LRU; not while a CUDA graph
    is captured). An upload is one pinned, non-blocking copy.

    Args:
        cu_seqlens: the caller's tensor (the cache key), or ``None`` (fixed-length rows,
            or a backward's host offsets: kept by the offsets' values, the last
            :data:`FIXED_TABLES_CACHE_SIZE` of them).
        offsets: what :func:`~cake_core.varlen.checked_offsets` returned for it (or
            :func:`~cake_core.varlen.seq_offsets`).
        chunk_size: tokens per chunk.
        device: ``None``: the host tables of :func:`cake_core.varlen.chunk_tables`
            ``(starts, ends, chunk_off, NC)`` on the CPU; else ``(key, (starts, ends,
            chunk_off, cu, NC))`` on ``device`` (``cu`` the int64 offsets there), ``key``
            naming the chunk size, device and CUDA stream they were made for (kept per
            key: a table is only reused on the stream it was copied on).

    Every tensor returned is shared with later calls: never modify it.
    """
    if device is None:
        if cu_seqlens is None:
            return _kept_by_value((_TABLES, chunk_size), offsets,
                                  lambda: chunk_tables(offsets, chunk_size))
        return offsets_derived(cu_seqlens, offsets, (_TABLES, chunk_size),
                               lambda: chunk_tables(offsets, chunk_size))
    key = _tables_key(chunk_size, device)

    def build():
        starts, ends, chunk_off, NC = chunk_tables_for(cu_seqlens, offsets, chunk_size)
        return (*_upload_tables(offsets, starts, ends, chunk_off, device), NC)

    if cu_seqlens is None:  # fixed-length rows (or a backward's host offsets): kept by value
        return key, _kept_by_value(key, offsets, build)
    return key, offsets_derived(cu_seqlens, offsets, key, build)


#: how many chunk tables (host, or per device and stream) of calls without ``cu_seqlens``
#: are kept, keyed by their offsets' values (least recently used first out; each holds a
#: few ``[NC]`` int32 tensors)
FIXED_TABLES_CACHE_SIZE = 16
_fixed_tables: OrderedDict = OrderedDict()
_fixed_lock = threading.Lock()


def _kept_by_value(key: tuple, offsets: torch.Tensor, build: Callable[[], Any]) -> Any:
    """``build()``, remembered per ``(key, offsets' values)``: calls of fixed-length rows
    (B rows of T tokens) rebuild and upload nothing after the first, so their forward and
    backward make no host-device synchronisation (and no host table work)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        # a CUDA graph would keep reading a cached table after the cache let it go: nothing
        # is served or kept while capturing (the upload then fails as it did before the cache)
        return build()
    k = (key, offsets.numpy().tobytes())  # int64 offsets: the bytes fix their count
    with _fixed_lock:
        if k in _fixed_tables:
            _fixed_tables.move_to_end(k)
            return _fixed_tables[k]
    value = build()
    with _fixed_lock:
        _fixed_tables[k] = value
        while len(_fixed_tables) > FIXED_TABLES_CACHE_SIZE:
            _fixed_tables.popitem(last=False)
    return value


def _upload_tables(offsets: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                   chunk_off: torch.Tensor, device: torch.device) -> tuple:
    """``(starts, ends, chunk_off, cu)`` on ``device`` in one host-to-device copy: the int64
    offsets and the three int32 tables packed as bytes (offsets first: 8-byte aligned), from
    pinned memory without waiting on CUDA (the copy is ordered before the launches on the
    current stream; torch keeps the pinned block until the copy is done). While a CUDA graph
    is captured the copy is the plain synchronous one, which CUDA refuses during a capture
    (as every table upload did before this packing): a captured pinned copy would read the
    pinned block again at every replay, after torch gave it back."""
    parts = [offsets.contiguous(), starts.contiguous(), ends.contiguous(),
             chunk_off.contiguous()]
    raw = [t.view(torch.uint8) for t in parts]
    host = torch.cat(raw)
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        dev = host.pin_memory().to(device, non_blocking=True)
    else:
        dev = host.to(device)
    out, at = [], 0
    for t, r in zip(parts, raw, strict=True):
        out.append(dev[at:at + r.numel()].view(t.dtype))
        at += r.numel()
    cu, starts_d, ends_d, chunk_off_d = out
    return starts_d, ends_d, chunk_off_d, cu


def saved_chunk_tables(saved: Any, chunk_size: int, device: torch.device) -> tuple:
    """The device chunk tables ``(starts, ends, chunk_off, cu, NC)`` a backward of ``saved``
    launches with: the forward's (``saved.meta["chunk_tables"]``, as :func:`chunk_tables_for`
    returned them) when they were made for this chunk size, device and stream, else built
    from :func:`host_offsets` (and uploaded)."""
    kept = saved.meta.get("chunk_tables")
    if kept is not None and kept[0] == _tables_key(chunk_size, device):
        return kept[1]
    return chunk_tables_for(None, host_offsets(saved), chunk_size, device)[1]


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
                   cache: dict) -> Plan:
    """The body of a family's ``make_plan(head_k_dim, head_v_dim, dtype, device)``.

    Checks the arguments (device first, then K and V as ints in ``[1, max_head_dim]``, then
    the dtype), returns ``rule(K, V, dtype, device)`` memoised in ``cache`` per
    ``(K, V, dtype, device type)`` (:func:`cake_core.plan.cached_plan`), and on CUDA refuses
    a plan that ``cuda_plan_problem(plan, dtype)`` says cannot run.

    Raises:
        ValueError: ``device: ...``, ``head_k_dim: ...``, ``head_v_dim: ...``,
            ``dtype: ...``, or ``make_plan(K=.., V=.., dtype): <problem>``.
    """
    device = check_device(device)
    K = check_int(head_k_dim, "head_k_dim", 1, max_head_dim)
    V = check_int(head_v_dim, "head_v_dim", 1, max_head_dim)
    check_float_dtype(dtype)
    plan = cached_plan(cache, (K, V, dtype, device.type), lambda: rule(K, V, dtype, device))
    if device.type == "cuda":
        problem = cuda_plan_problem(plan, dtype)
        if problem is not None:
            raise ValueError(f"make_plan(K={K}, V={V}, {dtype}): {problem}")
    return plan


def resolve_plan(plan: object, K: int, V: int, dtype: torch.dtype, device: torch.device, *,
                 plan_type: type[Plan], make_plan: Callable[..., Plan],
                 cuda_plan_problem: Callable[[Plan, torch.dtype], str | None],
                 cache: dict) -> Plan:
    """The plan a call runs: ``make_plan(K, V, dtype, device)`` when ``plan`` is ``None``
    (memoised in ``cache`` per ``(K, V, dtype, device)``), else the caller's after
    :func:`~cake_core.require_mode` (``plan_type``, det), a head-dims check and, on CUDA,
    ``cuda_plan_problem``.

    Raises:
        ValueError: ``plan: ...`` naming what is wrong.
    """
    if plan is None:
        return cached_plan(cache, (K, V, dtype, device), lambda: make_plan(K, V, dtype, device))
    require_mode(plan, plan_type, Mode.DET, name="plan")
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
                      chunk_buffers: tuple[str, ...] = ("h",)):
    """``None``, or the caller's workspace after every check: type and mode
    (:func:`~cake_core.require_mode`), plan and device (:meth:`Workspace.check`), each
    buffer of ``buffer_shapes`` (name -> dims after the leading token or chunk dim) present,
    contiguous and of ``buffer_dtype``, and room for ``tokens`` tokens (every buffer not in
    ``chunk_buffers``) and ``chunks`` chunks.

    Raises:
        ValueError: ``workspace: ...`` naming what is wrong.
    """
    if workspace is None:
        return None
    require_mode(workspace, workspace_type, Mode.DET, name="workspace")
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
    saved tokens and their ``chunk_size``-token chunks (the forward's chunk tables, or
    :func:`host_offsets`)."""
    B, T, _, K = saved.q.shape
    HV, V = saved.v.shape[2], saved.v.shape[3]
    dtype = saved.q.dtype
    plan = resolve_plan(plan if plan is not None else saved.plan, K, V, dtype, device)
    kept = saved.meta.get("chunk_tables")
    if saved.meta.get("seqs") is not None:
        NC = saved_chunks(saved, chunk_size, device).num_chunks
    elif kept is not None and kept[0][1] == chunk_size:
        NC = kept[1][4]
    else:
        NC = chunk_tables(host_offsets(saved), chunk_size)[3]
    return plan, resolve_workspace(workspace, plan, device, HV, B * T, NC, dtype)


# ----------------------------------------------------------------------------- saved sets


def beta_code(use_sigmoid: bool, allow_neg_eigval: bool) -> int:
    """How the kernels read beta: 0 as given; 1 ``sigmoid(beta)``; 2 ``2 * sigmoid(beta)``
    (FLA's ``allow_neg_eigval``)."""
    return (2 if allow_neg_eigval else 1) if use_sigmoid else 0


def saved_meta(*, scale: float, use_qk_l2norm: bool, plan: Plan, varlen: bool,
               use_gate_in_kernel: bool, beta: int, cu_host: torch.Tensor | None = None,
               **extra: Any) -> dict[str, Any]:
    """The metadata a forward keeps beside its saved tensors: ``scale``, ``use_qk_l2norm``,
    ``plan``, ``varlen`` (``cu_seqlens`` was given), ``use_gate_in_kernel``,
    ``use_beta_sigmoid_in_kernel`` and ``allow_neg_eigval`` (from the :func:`beta_code`
    ``beta``), ``cu_host`` (the int64 CPU offsets the forward read, so the backward needs no
    host sync; ``None``: it reads ``cu_seqlens``) and the family's ``extra`` entries (e.g.
    ``chunk_tables``: the forward's device tables, :func:`chunk_tables_for`, which a
    backward on the same device and stream reuses: :func:`saved_chunk_tables`)."""
    return {"scale": scale, "use_qk_l2norm": use_qk_l2norm, "plan": plan, "varlen": varlen,
            "use_gate_in_kernel": use_gate_in_kernel, "use_beta_sigmoid_in_kernel": bool(beta),
            "allow_neg_eigval": beta == 2, "cu_host": cu_host, **extra}


def host_offsets(saved: Any) -> torch.Tensor:
    """int64 CPU offsets ``[N + 1]`` of a saved set's sequences: the forward's copy
    (``saved.meta["cu_host"]``), or ``saved.cu_seqlens`` read from its device (one sync)
    when the saved set does not carry one."""
    cu = saved.meta.get("cu_host")
    return cu if cu is not None else saved.cu_seqlens.detach().to("cpu", torch.int64)


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
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens.tolist()]
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    outs, finals = [], []
    for n, (b, bos, eos) in enumerate(spans):
        if initial_state is not None:
            S = initial_state[n].to(dtype)
        else:
            S = torch.zeros(HV, K, V, dtype=dtype, device=q.device)
        seq_out = []
        for t in range(bos, eos):
            kt, vt, qt = k[b, t], v[b, t], q[b, t]          # [HV, K], [HV, V], [HV, K]
            decay = torch.exp(g[b, t])                     # [HV] or [HV, K]
            S = S * (decay[:, None, None] if decay.dim() == 1 else decay[:, :, None])
            kS = torch.einsum("hk,hkv->hv", kt, S)
            u = beta[b, t][:, None] * (vt - kS)
            S = S + kt[:, :, None] * u[:, None, :]
            seq_out.append(scale * torch.einsum("hk,hkv->hv", qt, S))
        outs.append(torch.stack(seq_out) if seq_out else v.new_zeros((0, HV, V)))
        finals.append(S)
    if cu_seqlens is None:
        o = torch.stack(outs) if outs else v.new_zeros((B, T, HV, V))
    else:
        o = torch.cat(outs).unsqueeze(0)
    final = None
    if output_final_state:
        final = torch.stack(finals) if finals else v.new_zeros((0, HV, K, V))
    return o, final
