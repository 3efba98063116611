"""The grouped GEMM kernels: forward/dgrad over a device-side tile schedule, split-K wgrad,
and the zeroing of the rows past the last expert after ``torch._grouped_mm``.

No host sync: the launch grids are upper bounds known from shapes alone, and every program
finds its expert and rows by reading the schedule (built from the offsets on the device:
``kernels.meta``). Programs with nothing to do compute nothing and store nothing.

Schedule ``SCHED`` (int32 ``[3, G]``, G = E + 1 groups, built by ``schedule_kernel``):
row 0 the first row of each group, row 1 its end (exclusive), row 2 the cumulative count of
``BLOCK_M`` row tiles through that group. Group e < E is expert e; group E is the tail
(rows past the last expert's end), whose tiles store zeros. Rows are non-decreasing and in
``[0, M]`` by construction (offsets clamped and run through a running max on the device).
"""

from __future__ import annotations

from cake_core.triton_utils import dot, select_backend, tl, triton

select_backend()


#: Output tile rows per group in the wgrad's launch order (:func:`_wgrad_slice`).
WGRAD_GROUP: tl.constexpr = tl.constexpr(8)


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return dot(a, b, acc)


@triton.jit
def _schedule_tile(SCHED, G, t, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Row tile slot ``t`` in the schedule: ``(valid, g, row0, row_hi, r_on)`` with g its
    group, row0 its first row, row_hi the group's row end and r_on whether it multiplies
    (not the tail group, not an empty slot)."""
    gi = tl.arange(0, BLOCK_G)
    tile_end = tl.load(SCHED + 2 * G + gi, mask=gi < G, other=2147483647)
    total = tl.load(SCHED + 2 * G + G - 1)
    valid = t < total
    g = tl.minimum(tl.sum((tile_end <= t).to(tl.int32), axis=0), G - 1)
    first = tl.load(SCHED + 2 * G + g - 1, mask=g > 0, other=0)
    row_lo = tl.load(SCHED + g)
    row_hi = tl.load(SCHED + G + g)
    row0 = row_lo + (t - first) * BLOCK_M
    return valid, g, row0, row_hi, valid & (g < G - 1)


@triton.jit
def _wgrad_slice(ENDS, ORDER, pid, s, n_tiles_n, n_tiles_k, SPLIT: tl.constexpr,
                 BLOCK_K: tl.constexpr, REORDER: tl.constexpr):
    """Program ``pid`` of slice ``s``: ``(e, pid_n, pid_k, lo, hi)``, expert e's output tile
    and the rows ``[lo, hi)`` of its slice (see :func:`grouped_wgrad_kernel`). ``REORDER``:
    the ``pid // tiles-per-expert``-th expert of ``ORDER`` (int32 ``[E]``, a permutation),
    else that index itself. Inside an expert the tiles go in groups of ``WGRAD_GROUP`` tile
    rows, down the rows of a group before the next column (programs launched together
    share dy and x columns in L2); a launch order only, every tile's sum is the same."""
    per_e = n_tiles_n * n_tiles_k
    if REORDER:
        e = tl.load(ORDER + pid // per_e)
    else:
        e = pid // per_e
    rest = pid % per_e
    per_group = WGRAD_GROUP * n_tiles_k
    first_n = (rest // per_group) * WGRAD_GROUP
    rows_in_group = tl.minimum(n_tiles_n - first_n, WGRAD_GROUP)
    pid_n = first_n + (rest % per_group) % rows_in_group
    pid_k = (rest % per_group) // rows_in_group
    lo_e = tl.load(ENDS + e - 1, mask=e > 0, other=0)
    hi_e = tl.load(ENDS + e)
    per_split = ((hi_e - lo_e + SPLIT - 1) // SPLIT + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    lo = lo_e + s * per_split
    hi = tl.minimum(hi_e, lo + per_split)
    return e, pid_n, pid_k, lo, hi


@triton.jit
def grouped_mm_kernel(
    A, B, C, SCHED, G, n_cols, R,
    stride_am, stride_ar, stride_be, stride_br, stride_bc, stride_cm, stride_cn,
    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """``C[rows of g] = A[rows of g] @ B[g]`` for one row tile (axis 0: the slot among all
    groups' row tiles, in group order) and one column tile (axis 1). ``A`` ``[M, R]``,
    ``B[g]`` ``[R, n_cols]`` (strided: ``weight[e]ᵀ`` for the forward, ``weight[e]`` for the
    dgrad), ``C`` ``[M, n_cols]``. The tail group's tiles store zeros; slots past the last
    tile store nothing. R is walked in increasing ``BLOCK_K`` steps (fixed order)."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    valid, g, row0, row_hi, r_on = _schedule_tile(SCHED, G, t, BLOCK_M, BLOCK_G)
    rm = row0 + tl.arange(0, BLOCK_M)
    mm = (rm < row_hi) & valid
    rm = rm.to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    nm = rn < n_cols
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    # the tail group (g == G - 1) and empty slots multiply nothing: acc stays 0
    r_end = tl.where(r_on, R, 0)
    b_base = B + g.to(tl.int64) * stride_be
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, r_end, BLOCK_K):
        ks = k0 + rk
        km = ks < R
        a = tl.load(A + rm[:, None] * stride_am + ks[None, :] * stride_ar,
                    mask=mm[:, None] & km[None, :], other=0.0)
        b = tl.load(b_base + ks[:, None] * stride_br + rn[None, :] * stride_bc,
                    mask=km[:, None] & nm[None, :], other=0.0)
        acc = _mma(a, b, acc, IEEE)
    c_ptrs = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mm[:, None] & nm[None, :])


@triton.jit
def grouped_wgrad_kernel(
    DY, X, OUT, ENDS, ORDER, N, K, n_tiles_n, n_tiles_k,
    stride_dym, stride_dyn, stride_xm, stride_xk,
    stride_os, stride_oe, stride_on, stride_ok,
    SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    REORDER: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of ``dW[e] = dy[rows of e]ᵀ @ x[rows of e]`` over
    slice ``s`` (axis 1) of expert e's rows. Axis 0: ``slot * n_tiles_n * n_tiles_k + tile``,
    expert ``e = slot`` (or ``ORDER[slot]`` with ``REORDER``: plan ``wgrad_order``; the
    launch order only, each tile's computation is the same).

    Expert e's rows ``[lo, hi)`` (``ENDS`` int32 ``[E]``, non-decreasing, read here) are cut
    into ``SPLIT`` slices of ``cdiv(cdiv(hi - lo, SPLIT), BLOCK_K) * BLOCK_K`` rows (trailing
    slices may be empty); each slice walks its rows in increasing ``BLOCK_K`` steps and stores
    its fp32 sum at ``OUT + s * stride_os`` (a partial plane), or, with ``SPLIT == 1``, the
    cast result (``ACCUMULATE``: ``OUT + sum`` in fp32, Megatron's ``main_grad``). Every
    program stores its tile, an empty expert or slice zeros, so no stale content survives."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    e, pid_n, pid_k, lo, hi = _wgrad_slice(ENDS, ORDER, pid, s, n_tiles_n, n_tiles_k, SPLIT,
                                           BLOCK_K, REORDER)
    rn = (pid_n * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rk = (pid_k * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    nm = rn < N
    km = rk < K
    rr = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(lo, hi, BLOCK_K):
        rows = r0 + rr
        rmask = rows < hi
        rows = rows.to(tl.int64)
        a = tl.load(DY + rows[None, :] * stride_dym + rn[:, None] * stride_dyn,
                    mask=nm[:, None] & rmask[None, :], other=0.0)
        b = tl.load(X + rows[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=rmask[:, None] & km[None, :], other=0.0)
        acc = _mma(a, b, acc, IEEE)
    o_ptrs = (OUT + s.to(tl.int64) * stride_os + e.to(tl.int64) * stride_oe
              + rn[:, None] * stride_on + rk[None, :] * stride_ok)
    omask = nm[:, None] & km[None, :]
    if ACCUMULATE:
        acc = tl.load(o_ptrs, mask=omask, other=0.0) + acc
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=omask)


@triton.jit
def grouped_mm_tma_kernel(
    A_DESC, B_DESC, C, SCHED, G, n_cols, R, stride_cm, stride_cn,
    B_T: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
):
    """:func:`grouped_mm_kernel` with TMA-descriptor operand loads (same schedule, steps,
    masked stores). ``A_DESC``: A ``[M, R]`` row-major, ``[BLOCK_M, BLOCK_K]`` boxes read at
    the tile's first row (rows past the expert's end are the next group's rows, dropped by
    the store mask; rows past M and columns past R come back as zeros). ``B_DESC``: the
    weight ``[E, N, K]`` (3-D, so reads past one expert's N or K are zeros). ``B_T``
    (forward, ``B[g] = W[g]ᵀ``): ``[1, BLOCK_N, BLOCK_K]`` boxes at ``(g, column, step)``,
    transposed in registers; else (dgrad, ``B[g] = W[g]``) ``[1, BLOCK_K, BLOCK_N]`` boxes at
    ``(g, step, column)``. ``C`` ``[M, n_cols]`` written through pointers."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    valid, g, row0, row_hi, r_on = _schedule_tile(SCHED, G, t, BLOCK_M, BLOCK_G)
    n0 = pid_n * BLOCK_N
    # the tail group (g == G - 1) and empty slots load and multiply nothing: acc stays 0
    r_end = tl.where(r_on, R, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, r_end, BLOCK_K):
        a = A_DESC.load([row0, k0])
        if B_T:
            b = tl.trans(tl.reshape(B_DESC.load([g, n0, k0]), [BLOCK_N, BLOCK_K]))
        else:
            b = tl.reshape(B_DESC.load([g, k0, n0]), [BLOCK_K, BLOCK_N])
        acc = _mma(a, b, acc, IEEE)
    rm = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    mm = (rm < row_hi) & valid
    rn = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    c_ptrs = C + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mm[:, None] & (rn < n_cols)[None, :])


@triton.jit
def grouped_wgrad_tma_kernel(
    DY_DESC, X_DESC, OUT, ENDS, ORDER, N, K, n_tiles_n, n_tiles_k,
    stride_os, stride_oe, stride_on, stride_ok,
    SPLIT: tl.constexpr, ACCUMULATE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    REORDER: tl.constexpr,
):
    """:func:`grouped_wgrad_kernel` with TMA-descriptor operand loads (same slices, steps,
    epilogue). ``DY_DESC``: dy ``[M, N]`` row-major, ``[BLOCK_K, BLOCK_M]`` boxes transposed
    in registers; ``X_DESC``: x ``[M, K]``, ``[BLOCK_K, BLOCK_N]`` boxes. The slice's whole
    ``BLOCK_K`` steps load unmasked (straight to the MMA); the last partial step, if any,
    zeroes the rows at or past the slice end after the load (``tl.where`` on both tiles), so
    rows of other experts contribute exact zeros (also when they hold inf or NaN)."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    e, pid_n, pid_k, lo, hi = _wgrad_slice(ENDS, ORDER, pid, s, n_tiles_n, n_tiles_k, SPLIT,
                                           BLOCK_K, REORDER)
    r_full = lo + tl.maximum(hi - lo, 0) // BLOCK_K * BLOCK_K  # end of the whole steps
    n0 = pid_n * BLOCK_M
    k0 = pid_k * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(lo, r_full, BLOCK_K):
        a = tl.trans(DY_DESC.load([r0, n0]))
        b = X_DESC.load([r0, k0])
        acc = _mma(a, b, acc, IEEE)
    if r_full < hi:
        keep = (r_full + tl.arange(0, BLOCK_K)) < hi
        a = DY_DESC.load([r_full, n0])
        a = tl.trans(tl.where(keep[:, None], a, tl.zeros_like(a)))
        b = X_DESC.load([r_full, k0])
        b = tl.where(keep[:, None], b, tl.zeros_like(b))
        acc = _mma(a, b, acc, IEEE)
    rn = (n0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    rk = (k0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    o_ptrs = (OUT + s.to(tl.int64) * stride_os + e.to(tl.int64) * stride_oe
              + rn[:, None] * stride_on + rk[None, :] * stride_ok)
    omask = (rn < N)[:, None] & (rk < K)[None, :]
    if ACCUMULATE:
        acc = tl.load(o_ptrs, mask=omask, other=0.0) + acc
    tl.store(o_ptrs, acc.to(OUT.dtype.element_ty), mask=omask)


@triton.jit
def zero_tail_rows_kernel(
    OUT, ENDS, E, M, n_cols, stride_om, stride_on,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Zeros into the rows ``[ENDS[E - 1], M)`` of ``OUT`` ``[M, n_cols]``: the rows of no
    expert, which ``torch._grouped_mm`` leaves unwritten (plan ``grouped_mm_fwd_dgrad``).
    Program p owns rows ``[p · BLOCK_R, (p + 1) · BLOCK_R)`` (grid ``cdiv(M, BLOCK_R)``, a
    bound from the shape: no host sync); it reads the last row end from the device and,
    when all its rows lie before that end, stores nothing (a loop of zero steps); else it
    stores zeros to its rows at or past the end, ``BLOCK_C`` columns per step."""
    pid = tl.program_id(0)
    end = tl.load(ENDS + E - 1).to(tl.int64)
    r0 = pid.to(tl.int64) * BLOCK_R
    rows = r0 + tl.arange(0, BLOCK_R).to(tl.int64)
    rmask = (rows >= end) & (rows < M)
    c_end = tl.where(r0 + BLOCK_R > end, n_cols, 0)
    cols = tl.arange(0, BLOCK_C).to(tl.int64)
    zeros = tl.zeros([BLOCK_R, BLOCK_C], dtype=OUT.dtype.element_ty)
    for c0 in range(0, c_end, BLOCK_C):
        cc = c0 + cols
        tl.store(OUT + rows[:, None] * stride_om + cc[None, :] * stride_on, zeros,
                 mask=rmask[:, None] & (cc < n_cols)[None, :])
