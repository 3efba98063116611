"""Shared deterministic GEMM kernels: a strided, split-able matmul and an ordered sum.

Families that multiply (dense projection, LM-head loss, MoE grouped GEMM) reuse these:

- :func:`matmul_kernel`: ``C[s] (+)= A[:, Kslice_s] @ B[Kslice_s, :] (+ bias)`` over arbitrary
  strides (a transposed operand is a strided view, never a copy), fp32 accumulation, grouped
  tile order (``GROUP_M`` row tiles share their B columns while resident in L2). Grid axis 0
  walks the output tiles, axis 1 the ``SPLIT`` fixed slices of the reduction dimension: slice
  ``s`` covers ``[s * k_per_split, (s + 1) * k_per_split)`` and writes its own fp32 partial
  plane ``C + s * stride_cs``. With ``SPLIT == 1`` C is the output itself, in any dtype.
- :func:`ordered_sum_kernel`: ``out = partial[0] + partial[1] + ... + partial[S-1]`` in index
  order, in fp32 (one sequential add per slice, the same order in every tile), written cast
  to ``out``'s dtype or added into an fp32 accumulator (Megatron's ``main_grad``).
- :func:`group_sum_cast_kernel`: the fixed-order sum of per-value-head gradients into their
  q/k heads (GDN, KDA) fused with the cast to the output dtype.
- :func:`matmul_tma_kernel`: the same product (no bias; the device scale) with A and B read through
  TMA tensor descriptors (host-side :class:`triton.tools.tensor_descriptor.TensorDescriptor`,
  so no device scratch allocator is needed) instead of masked pointer loads; out-of-range
  rows and columns come back as zeros from the descriptor. A transposed operand (``dy.t()``
  of the dense wgrad) is described as its row-major source and each tile is transposed in
  registers before the dot. The epilogue writes a bf16/fp16 output of an unsplit product
  through a TMA store, and otherwise (fp32 accumulate, partial planes) uses masked pointer
  stores as :func:`matmul_kernel` does. Optionally persistent: a fixed grid of programs,
  program ``p`` computing work items ``p, p + P, p + 2P, ...`` (each output tile of each
  slice written by exactly one program, its K order the same as in the one-program-per-tile
  launch, so the bits do not depend on P or on timing). Off unless ``matmul(..., tma=True)``.

No atomics anywhere, so equal inputs, launch parameters and hardware give equal bits. The
host helpers :func:`matmul` and :func:`ordered_sum` launch them; kernels and helpers never
allocate (outputs and partial planes come from the caller). Importing this module imports
Triton (after :mod:`cake_core.triton_utils` picked the backend).

Precision: bf16/fp16 operands multiply on tensor cores with fp32 accumulation (through
:func:`cake_core.triton_utils.dot`, interpreter-safe). fp32 operands multiply as
``fp32_precision`` says (one of :data:`FP32_DOTS`): ``"ieee"`` (default; exact fp32
products on the CUDA cores), ``"bf16x6"`` (each operand split into three bf16 parts and the
six leading cross products summed in fp32 on tensor cores: about fp32's accuracy at several
times "ieee"'s speed on Hopper), ``"tf32x3"``, or ``"tf32"`` (``allow_tf32=True``, not
exact). The interpreter always computes in fp32 (it runs "bf16x6" as "ieee").
"""

from __future__ import annotations

import torch

from cake_core.triton_utils import dot, is_interpreting, select_backend, sm_count, tl, triton

select_backend()

try:  # host-side TMA descriptors: Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402
except ImportError:  # older Triton: the pointer kernels only; tma=True raises ValueError
    TensorDescriptor = None


def tma_available() -> bool:
    """Whether this Triton has host-side TMA descriptors (``triton.tools.tensor_descriptor``,
    Triton >= 3.4); plan rules pick TMA kernels only then."""
    return TensorDescriptor is not None

__all__ = ["FP32_DOTS", "direct_store_dtype", "group_sum_cast", "group_sum_cast_kernel", "matmul",
           "matmul_kernel", "matmul_tma_kernel", "ordered_sum", "ordered_sum_kernel",
           "tma_available", "tma_layout_problem", "tma_readable"]

#: largest TMA box edge (elements) a descriptor block may have
TMA_MAX_BOX = 256
#: the ``input_precision`` values fp32 operands may multiply in, by index (a plan's
#: ``fp32_dots`` field holds the index)
FP32_DOTS = ("tf32", "ieee", "tf32x3", "bf16x6")


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    if PREC == "":  # 16-bit operands, or fp32 as tf32: the interpreter-safe helper
        return dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def matmul_kernel(
    A, B, C, BIAS, SCALE,
    M, N, K, k_per_split, n_tiles_m, n_tiles_n,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, PREC: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One output tile of one reduction slice; see the module docstring."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    # grouped order: GROUP_M row tiles walk the column tiles together (L2 reuse of B)
    in_group = GROUP_M * n_tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(n_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m

    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    mm = rm < M
    nm = rn < N
    k_lo = s * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + rk
        km = ks < k_hi
        a = tl.load(A + rm[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=mm[:, None] & km[None, :], other=0.0)
        b = tl.load(B + ks[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=km[:, None] & nm[None, :], other=0.0)
        acc = _mma(a, b, acc, PREC)
    if HAS_SCALE:  # a device scalar (no host sync): C (+)= scale * (A @ B) (+ bias)
        acc = acc * tl.load(SCALE).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    c_ptrs = C + s.to(tl.int64) * stride_cs + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    cmask = mm[:, None] & nm[None, :]
    if ACCUMULATE:
        acc = tl.load(c_ptrs, mask=cmask, other=0.0) + acc
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=cmask)


@triton.jit
def _tma_tile(A_DESC, B_DESC, C, C_DESC, SCALE, tile, s, M, N, K, k_per_split, n_tiles_m,
              n_tiles_n, stride_cs, stride_cm, stride_cn,
              A_T: tl.constexpr, B_T: tl.constexpr, C_TMA: tl.constexpr, ACCUMULATE: tl.constexpr,
              PREC: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile ``tile`` (grouped order, as in matmul_kernel) of reduction slice ``s``."""
    in_group = GROUP_M * n_tiles_n
    first_m = (tile // in_group) * GROUP_M
    group_m = tl.minimum(n_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % in_group) % group_m
    pid_n = (tile % in_group) // group_m
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_lo = s * k_per_split  # a multiple of BLOCK_K: a block never crosses a slice end
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if A_T:  # A_DESC describes A^T [K, M] (row-major): load [BLOCK_K, BLOCK_M], transpose
            a = tl.trans(A_DESC.load([k0, off_m]))
        else:
            a = A_DESC.load([off_m, k0])
        if B_T:  # B_DESC describes B^T [N, K]
            b = tl.trans(B_DESC.load([off_n, k0]))
        else:
            b = B_DESC.load([k0, off_n])
        acc = _mma(a, b, acc, PREC)
    if HAS_SCALE:  # a device scalar (no host sync), as in matmul_kernel
        acc = acc * tl.load(SCALE).to(tl.float32)
    if C_TMA:  # split 1, no accumulate: a TMA store (clipped at the edges) of the cast tile
        C_DESC.store([off_m, off_n], acc.to(C_DESC.dtype))
    else:
        rm = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
        c_ptrs = C + s.to(tl.int64) * stride_cs + rm[:, None] * stride_cm + \
            rn[None, :] * stride_cn
        cmask = (rm < M)[:, None] & (rn < N)[None, :]
        if ACCUMULATE:
            acc = tl.load(c_ptrs, mask=cmask, other=0.0) + acc
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=cmask)


@triton.jit
def matmul_tma_kernel(
    A_DESC, B_DESC, C, C_DESC, SCALE,
    M, N, K, k_per_split, n_tiles_m, n_tiles_n, n_splits,
    stride_cs, stride_cm, stride_cn,
    A_T: tl.constexpr, B_T: tl.constexpr, C_TMA: tl.constexpr, ACCUMULATE: tl.constexpr,
    PREC: tl.constexpr, HAS_SCALE: tl.constexpr,
    PERSISTENT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """``C[s] (+)= scale * (A[:, Kslice_s] @ B[Kslice_s, :])`` with TMA-descriptor operand
    loads (``HAS_SCALE``: the fp32 scalar at ``SCALE``; split 1 only, as the host enforces).

    Not persistent: grid ``(tiles, n_splits)``, one output tile of one slice per program.
    Persistent: a 1-D grid of P programs; program p takes work items ``w = p, p + P, ...``
    (``w = s * tiles + tile``), each computed exactly as in the other launch.
    ``C_TMA``: the cast tile is written through ``C_DESC`` (a TMA store; split 1, no
    accumulate) instead of masked pointer stores to ``C``: the same values."""
    if PERSISTENT:
        n_tiles = n_tiles_m * n_tiles_n
        for w in range(tl.program_id(0), n_tiles * n_splits, tl.num_programs(0)):
            _tma_tile(A_DESC, B_DESC, C, C_DESC, SCALE, w % n_tiles, w // n_tiles, M, N, K,
                      k_per_split, n_tiles_m, n_tiles_n, stride_cs, stride_cm, stride_cn,
                      A_T, B_T, C_TMA, ACCUMULATE, PREC, HAS_SCALE, BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M)
    else:
        _tma_tile(A_DESC, B_DESC, C, C_DESC, SCALE, tl.program_id(0), tl.program_id(1), M, N,
                  K, k_per_split, n_tiles_m, n_tiles_n, stride_cs, stride_cm, stride_cn,
                  A_T, B_T, C_TMA, ACCUMULATE, PREC, HAS_SCALE, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M)


@triton.jit
def ordered_sum_kernel(P, OUT, n_parts, numel, stride_p,
                       ACCUMULATE: tl.constexpr, BLOCK: tl.constexpr,
                       UNROLL: tl.constexpr = 8):
    """``OUT[i] (= | +=) sum_s P[s * stride_p + i]`` for s = 0, 1, ..., n_parts-1 in order."""
    pid = tl.program_id(0)
    offs = (pid * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    m = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    ptrs = P + offs
    # UNROLL independent loads per step, added in part order: few programs (a small numel
    # over many parts) wait on one load latency per UNROLL parts, not per part
    for _ in range(0, n_parts // UNROLL):
        for _j in tl.static_range(UNROLL):
            acc += tl.load(ptrs, mask=m, other=0.0)
            ptrs += stride_p  # pointer steps: no int32 overflow of s * stride_p
    for _ in range(0, n_parts % UNROLL):
        acc += tl.load(ptrs, mask=m, other=0.0)
        ptrs += stride_p
    if ACCUMULATE:
        acc = tl.load(OUT + offs, mask=m, other=0.0) + acc
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def group_sum_cast_kernel(X, OUT, numel, K, G: tl.constexpr, BLOCK: tl.constexpr):
    """``OUT[r, kk] = ((X[r, 0, kk] + X[r, 1, kk]) + ...) + X[r, G - 1, kk]`` in fp32 (X
    viewed ``[R, G, K]``, OUT ``[R, K]``), cast once to OUT's dtype."""
    pid = tl.program_id(0)
    offs = (pid * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    m = offs < numel
    src = X + (offs // K) * (G * K) + offs % K
    acc = tl.load(src, mask=m, other=0.0)
    for j in tl.static_range(1, G):
        acc += tl.load(src + j * K, mask=m, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=m)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _prec(dtype: torch.dtype, fp32_precision: str) -> str:
    """The kernels' ``PREC``: "" for 16-bit operands and for "tf32" (the dot helper), else
    the fp32 ``input_precision`` (the interpreter takes only "ieee", "tf32", "tf32x3" and
    computes every one in fp32)."""
    if dtype != torch.float32 or fp32_precision == "tf32":
        return ""
    if is_interpreting() and fp32_precision == "bf16x6":
        return "ieee"
    return fp32_precision


def tma_layout_problem(t: torch.Tensor, name: str = "operand") -> str | None:
    """Why the 2-D tensor ``t`` cannot be read through a TMA descriptor (None when it can).

    TMA takes a row-major or a column-major (transposed view) matrix whose other stride is a
    multiple of 16 bytes and at least a row's length (no expanded or overlapping rows), at a
    16-byte aligned address, in fp32, bf16 or fp16."""
    if t.dim() != 2:
        return f"{name}: TMA operands must be 2-D, got {t.dim()}-D"
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"{name}: TMA operands must be fp32, bf16 or fp16, got {t.dtype}"
    es = t.element_size()
    if t.stride(1) == 1:
        lead, rows, row_len = t.stride(0), t.shape[0], t.shape[1]
    elif t.stride(0) == 1:
        lead, rows, row_len = t.stride(1), t.shape[1], t.shape[0]
    else:
        return (f"{name}: TMA needs one unit stride (row- or column-major), got strides "
                f"{tuple(t.stride())}")
    if rows > 1 and lead < row_len:  # expanded (stride 0) or overlapping rows
        return (f"{name}: TMA needs rows that do not overlap, got strides "
                f"{tuple(t.stride())} for shape {tuple(t.shape)}")
    if (lead * es) % 16:
        return (f"{name}: TMA needs the leading stride to be a multiple of 16 bytes, got "
                f"{lead} elements of {es} bytes (strides {tuple(t.stride())})")
    if t.data_ptr() % 16:
        return f"{name}: TMA needs a 16-byte aligned start address"
    return None


def tma_readable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy when :func:`tma_layout_problem` finds its layout
    unreadable for TMA (a clone, not ``contiguous()``: that returns a contiguous view at an
    unaligned start as is)."""
    if tma_layout_problem(t) is not None:
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _tma_desc(t: torch.Tensor, rows: int, cols: int) -> tuple[TensorDescriptor, bool]:
    """A descriptor of ``t`` ``[R, C]`` with ``[rows, cols]`` blocks, or of its row-major
    source ``t.T`` with ``[cols, rows]`` blocks when ``t`` is column-major; and whether the
    kernel must transpose the loaded tile."""
    if t.stride(1) == 1:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols]), False
    tt = t.t()
    return TensorDescriptor(tt, list(tt.shape), list(tt.stride()), [cols, rows]), True


def _matmul_tma(a, b, out, *, accumulate, split, partials, prec, block_m, block_n, block_k,
                group_m, num_warps, num_stages, persistent, num_programs, tma_store,
                scale=None):
    M, K = a.shape
    N = b.shape[1]
    for t, name in ((a, "a"), (b, "b")):
        why = tma_layout_problem(t, name)
        if why is not None:
            raise ValueError(f"matmul(tma=True): {why}")
    if K < 1:
        raise ValueError("matmul(tma=True): the reduction dimension K must be >= 1")
    if max(block_m, block_n, block_k) > TMA_MAX_BOX:
        raise ValueError(f"matmul(tma=True): block_m, block_n and block_k must be <= "
                         f"{TMA_MAX_BOX} (a TMA box edge), got {block_m}, {block_n}, {block_k}")
    a_desc, a_t = _tma_desc(a, block_m, block_k)
    b_desc, b_t = _tma_desc(b, block_k, block_n)
    store_ok = split == 1 and not accumulate and out.stride(1) == 1 and \
        tma_layout_problem(out) is None
    if tma_store is None:  # the rule: 16-bit outputs (an fp32 tile would need its own smem)
        tma_store = store_ok and out.element_size() == 2
    elif tma_store and not store_ok:
        raise ValueError("matmul(tma_store=True): needs split == 1, no accumulate and a "
                         "row-major out TMA can write (16-byte aligned start and row stride)")
    c_desc = TensorDescriptor(out, list(out.shape), list(out.stride()),
                              [block_m, block_n]) if tma_store else None
    tiles_m, tiles_n = _cdiv(M, block_m), _cdiv(N, block_n)
    if split == 1:
        c, k_per_split, strides = out, max(K, 1), (0, out.stride(0), out.stride(1))
        acc_in_kernel = accumulate
    else:
        if partials is None or tuple(partials.shape) != (split, M, N) or \
                partials.dtype != torch.float32 or not partials.is_contiguous():
            raise ValueError(f"partials: need a contiguous fp32 tensor [{split}, {M}, {N}]")
        c, k_per_split, strides = partials, _cdiv(_cdiv(K, split), block_k) * block_k, \
            tuple(partials.stride())
        acc_in_kernel = False
    work = tiles_m * tiles_n * split
    if persistent:
        p = num_programs if num_programs is not None else sm_count(out.device)
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"matmul: num_programs must be an int >= 1, got {p!r}")
        grid = (min(p, work),)
    else:
        grid = (tiles_m * tiles_n, split)
    matmul_tma_kernel[grid](
        a_desc, b_desc, c, c_desc, scale if scale is not None else c, M, N, K, k_per_split,
        tiles_m, tiles_n, split, *strides,
        A_T=a_t, B_T=b_t, C_TMA=bool(tma_store), ACCUMULATE=accumulate and acc_in_kernel, PREC=prec,
        HAS_SCALE=scale is not None,
        PERSISTENT=bool(persistent), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    if split > 1:
        ordered_sum(partials, out=None if accumulate else out,
                    accumulate_into=out if accumulate else None)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *,
           bias: torch.Tensor | None = None, accumulate: bool = False, split: int = 1,
           partials: torch.Tensor | None = None, allow_tf32: bool = False,
           fp32_precision: str = "ieee",
           block_m: int = 64, block_n: int = 64, block_k: int = 32, group_m: int = 8,
           num_warps: int = 4, num_stages: int = 3,
           scale: torch.Tensor | None = None, tma: bool = False, persistent: bool = False,
           num_programs: int | None = None, tma_store: bool | None = None) -> torch.Tensor:
    """``out (+)= scale * (a @ b) (+ bias)`` with fp32 accumulation; returns ``out``.

    Args:
        a: ``[M, K]``, any strides (pass ``w.t()`` for ``x @ w.T``); b: ``[K, N]``, same dtype
            (fp32, bf16 or fp16).
        out: ``[M, N]``, any strides. Without ``accumulate``: written, cast to its dtype.
            With ``accumulate``: must be fp32 and receives ``out + a @ b`` (read-modify-write).
        bias: optional ``[N]`` (contiguous), added in fp32 before the cast.
        split: number S of fixed slices of the reduction dimension (deterministic split-K).
            With ``S > 1`` the slices' fp32 products go to ``partials`` (fp32 ``[S, M, N]``,
            contiguous), then :func:`ordered_sum` adds them in slice order into ``out``
            (``bias`` is added to slice 0 only). Slice length: ``cdiv(cdiv(K, S), block_k) *
            block_k``; trailing slices may be empty (their plane is written with zeros).
        allow_tf32: fp32 operands multiply as tf32 (faster, not exact), whatever
            ``fp32_precision`` says. Ignored for 16-bit operands.
        fp32_precision: how fp32 operands multiply, one of :data:`FP32_DOTS` (see the
            module docstring); "bf16x6" needs a GPU with bf16 tensor cores (compute
            capability >= 8); the interpreter computes "bf16x6" and "tf32x3" in fp32.
            Ignored for 16-bit operands. Else ``ValueError``.
        scale: optional one-element fp32 tensor on the device, read by the kernel (no host
            sync): the fp32 product is multiplied by it before the bias, the accumulate and
            the cast. Only with ``split == 1``.
        block_m / block_n / block_k (powers of two, >= 16), group_m, num_warps, num_stages:
            launch parameters. Equal parameters give equal bits; other ones may not.
        tma: read ``a`` and ``b`` through TMA tensor descriptors (:func:`matmul_tma_kernel`;
            Hopper's bulk tensor copies on sm_90+, the interpreter elsewhere) instead of
            pointer loads. Each of ``a`` and ``b`` must be row-major or a transposed view of
            a row-major matrix, with the other stride a multiple of 16 bytes and a 16-byte
            aligned start (:func:`tma_layout_problem`); blocks <= 256; no ``bias``
            (``scale`` as above); K >= 1. Else ``ValueError`` before any launch (no silent
            fallback).
            Same fp32 accumulation, tile order and slices as the pointer kernel: results
            agree within rounding, bits are fixed per launch parameters (not promised equal
            to ``tma=False``: the compiler may order the dot's inner products differently).
        persistent: with ``tma``, launch ``num_programs`` programs (default: the device's SM
            count; 4 on the CPU) that walk the (tile, slice) work items in a fixed order; bits
            equal those of the non-persistent TMA launch for equal tiles.
        tma_store: with ``tma``, write ``out`` through a TMA descriptor store instead of
            masked pointer stores (the same values, so the same bits). ``None`` (default):
            where it can and ``out`` is bf16/fp16 (split 1, no accumulate, ``out`` row-major,
            16-byte aligned; an fp32 tile would need its own shared-memory buffer: 128 KiB at
            128x256). ``True`` where it cannot: ``ValueError``.

    The caller checks shapes and devices; this helper only launches (no allocation).
    """
    if fp32_precision not in FP32_DOTS:  # before the empty-shape return: same answer
        raise ValueError(f"matmul: fp32_precision must be one of {FP32_DOTS}, "
                         f"got {fp32_precision!r}")
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return out
    prec = _prec(a.dtype, "tf32" if allow_tf32 else fp32_precision)
    if scale is not None and split != 1:
        raise ValueError("matmul: scale is supported with split == 1 only")
    if tma:
        if not tma_available():
            raise ValueError("matmul(tma=True) needs Triton >= 3.4 (triton.tools."
                             "tensor_descriptor); use tma=False")
        if bias is not None:
            raise ValueError("matmul(tma=True): bias is not supported")
        return _matmul_tma(a, b, out, accumulate=accumulate, split=split, partials=partials,
                           prec=prec, block_m=block_m, block_n=block_n, block_k=block_k,
                           group_m=group_m, num_warps=num_warps, num_stages=num_stages,
                           persistent=persistent, num_programs=num_programs,
                           tma_store=tma_store, scale=scale)
    if persistent or tma_store:
        raise ValueError("matmul: persistent=True and tma_store=True need tma=True")
    tiles_m, tiles_n = _cdiv(M, block_m), _cdiv(N, block_n)
    kw = dict(PREC=prec, HAS_SCALE=scale is not None, BLOCK_M=block_m, BLOCK_N=block_n,
              BLOCK_K=block_k, GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    if split == 1:
        matmul_kernel[(tiles_m * tiles_n, 1)](
            a, b, out, bias if bias is not None else out, scale if scale is not None else out,
            M, N, K, max(K, 1), tiles_m, tiles_n,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), 0, out.stride(0),
            out.stride(1), HAS_BIAS=bias is not None, ACCUMULATE=accumulate, **kw)
        return out
    if partials is None or tuple(partials.shape) != (split, M, N) or \
            partials.dtype != torch.float32 or not partials.is_contiguous():
        raise ValueError(f"partials: need a contiguous fp32 tensor [{split}, {M}, {N}]")
    k_per_split = _cdiv(_cdiv(K, split), block_k) * block_k
    matmul_kernel[(tiles_m * tiles_n, split)](
        a, b, partials, bias if bias is not None else partials, partials,
        M, N, K, k_per_split, tiles_m, tiles_n,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), partials.stride(0),
        partials.stride(1), partials.stride(2), HAS_BIAS=False, ACCUMULATE=False, **kw)
    if bias is not None:  # bias belongs to no slice; add it once, in a fixed place
        partials[0].add_(bias.float())
    ordered_sum(partials, out=None if accumulate else out,
                accumulate_into=out if accumulate else None)
    return out


def ordered_sum(partials: torch.Tensor, out: torch.Tensor | None = None,
                accumulate_into: torch.Tensor | None = None, *, block: int = 1024,
                num_warps: int = 4) -> torch.Tensor:
    """Sum ``partials`` (fp32 ``[S, ...]``, contiguous) over dim 0 in index order.

    Exactly one of ``out`` (contiguous, ``partials.shape[1:]``, any float dtype: written,
    cast once) and ``accumulate_into`` (contiguous fp32 of that shape: ``acc + sum``) is given.
    Per element the order is ``((p[0] + p[1]) + p[2]) + ...``, then the cast or the add.
    Returns the tensor written.
    """
    if (out is None) == (accumulate_into is None):
        raise ValueError("ordered_sum: give exactly one of out and accumulate_into")
    dst = out if out is not None else accumulate_into
    shape = tuple(partials.shape[1:])
    if tuple(dst.shape) != shape or not dst.is_contiguous() or not partials.is_contiguous() \
            or partials.dtype != torch.float32:
        raise ValueError(f"ordered_sum: need contiguous fp32 partials [S, *{list(shape)}] and a "
                         f"contiguous destination of shape {list(shape)}")
    if accumulate_into is not None and accumulate_into.dtype != torch.float32:
        raise ValueError("ordered_sum: accumulate_into must be fp32")
    numel = dst.numel()
    if numel == 0:
        return dst
    ordered_sum_kernel[(_cdiv(numel, block),)](
        partials, dst, partials.shape[0], numel, partials.stride(0) if partials.dim() else 0,
        ACCUMULATE=accumulate_into is not None, BLOCK=block, num_warps=num_warps)
    return dst


def direct_store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel should store a once-written fp32 result in, for a caller who wants
    ``dtype``: ``dtype`` itself (compiled kernels cast fp32 to bf16 / fp16 rounding to
    nearest even, as torch's ``.to`` does), except bf16 under Triton's interpreter, whose
    bf16 cast truncates: fp32 there, for the caller to cast with ``.to`` (same bits)."""
    return torch.float32 if dtype == torch.bfloat16 and is_interpreting() else dtype


def group_sum_cast(x: torch.Tensor, H: int, dtype: torch.dtype, *, block: int = 1024,
                   num_warps: int = 4) -> torch.Tensor:
    """``[NT, HV, K]`` fp32 per value head -> ``[NT, H, K]`` of ``dtype`` in one pass: each
    of the ``H`` q/k heads gets the sum of its ``G = HV // H`` consecutive value heads,
    added in index order (``((x[:, h*G] + x[:, h*G+1]) + ...)``, fp32; no atomics), then cast
    once to ``dtype``. The same bits as :func:`cake_core.varlen.group_sum` followed by
    ``.to(dtype)``, without the intermediate tensors (GDN / KDA read their dq and dk through
    it). ``x`` must be contiguous fp32 with ``HV`` a positive multiple of ``H`` (else
    ``ValueError``).
    Returns a new tensor, or ``x`` itself when ``G == 1`` and ``dtype`` is fp32.

    Under Triton's interpreter a bf16 output is summed and cast by torch (the interpreter's
    fp32 -> bf16 cast truncates; compiled kernels round to nearest even, as torch does)."""
    if x.dim() != 3 or x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"group_sum_cast: need a contiguous fp32 [NT, HV, K] tensor, got "
                         f"{x.dtype} {list(x.shape)}")
    NT, HV, K = x.shape
    if H < 1 or HV < H or HV % H:
        raise ValueError(f"group_sum_cast: HV = {HV} must be a positive multiple of H = {H}")
    G = HV // H
    if G == 1 and dtype == torch.float32:
        return x
    if dtype == torch.bfloat16 and is_interpreting():
        from cake_core.varlen import group_sum

        return group_sum(x, H).to(dtype)
    out = torch.empty((NT, H, K), dtype=dtype, device=x.device)
    numel = out.numel()
    if numel:
        group_sum_cast_kernel[(_cdiv(numel, block),)](x, out, numel, K, G=G, BLOCK=block,
                                                      num_warps=num_warps)
    return out
