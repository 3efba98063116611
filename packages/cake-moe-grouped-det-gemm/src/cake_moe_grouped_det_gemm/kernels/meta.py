"""The grouped GEMM's integer metadata, built on the device from the expert offsets in one
launch each (no host sync, no chain of small torch ops): the clamped row ends, the tile
schedule and the experts' order by row count. Integer arithmetic only, so the results are
exact and do not depend on the block sizes; any number of experts (one program walks them in
blocks, carrying the running sum and maximum).
"""

from __future__ import annotations

from cake_core.triton_utils import select_backend, tl, triton

select_backend()


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["n_exp", "n_rows"])
def row_ends_kernel(SRC, ENDS, n_exp, n_rows, IS_SIZES: tl.constexpr, BLOCK_E: tl.constexpr):
    """``ENDS[e]`` (int32) = the running maximum of ``clamp(v[e], 0, n_rows)``, with ``v`` the
    offsets ``SRC`` or, with ``IS_SIZES``, the running sum of the sizes ``SRC``: row ends
    non-decreasing and in ``[0, n_rows]`` whatever the values. One program."""
    carry_sum = tl.full([], 0, tl.int64)
    carry_max = tl.full([], 0, tl.int64)
    for e0 in range(0, n_exp, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        m = e < n_exp
        v = tl.load(SRC + e, mask=m, other=0).to(tl.int64)
        if IS_SIZES:
            raw = v
            v = tl.cumsum(raw, 0) + carry_sum
            carry_sum += tl.sum(raw, 0)
        v = tl.minimum(tl.maximum(v, 0), n_rows)
        v = tl.maximum(tl.associative_scan(v, 0, _maximum), carry_max)
        carry_max = tl.maximum(carry_max, tl.max(v, 0))
        tl.store(ENDS + e, v.to(tl.int32), mask=m)


@triton.jit(do_not_specialize=["n_exp", "n_rows"])
def schedule_kernel(ENDS, SCHED, n_exp, n_rows, block_m, BLOCK_G: tl.constexpr):
    """The tile schedule ``SCHED`` int32 ``[3, n_exp + 1]`` from the row ends: each group's
    first row, its end (group ``n_exp``, the tail, ends at ``n_rows``) and the running count
    of ``block_m``-row tiles through it. One program."""
    G = n_exp + 1
    carry = tl.full([], 0, tl.int64)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        m = g < G
        hi = tl.load(ENDS + g, mask=g < n_exp, other=0).to(tl.int64)
        hi = tl.where(g == n_exp, n_rows, hi)
        lo = tl.load(ENDS + g - 1, mask=(g >= 1) & m, other=0).to(tl.int64)
        tiles = tl.where(m, (hi - lo + block_m - 1) // block_m, 0)
        cum = tl.cumsum(tiles, 0) + carry
        carry += tl.sum(tiles, 0)
        tl.store(SCHED + g, lo.to(tl.int32), mask=m)
        tl.store(SCHED + G + g, hi.to(tl.int32), mask=m)
        tl.store(SCHED + 2 * G + g, cum.to(tl.int32), mask=m)


@triton.jit
def _rows_of(ENDS, e, m):
    """Rows of experts ``e`` (``ENDS[e] - ENDS[e - 1]``, ``ENDS[-1]`` read as 0)."""
    hi = tl.load(ENDS + e, mask=m, other=0).to(tl.int64)
    lo = tl.load(ENDS + e - 1, mask=m & (e >= 1), other=0).to(tl.int64)
    return hi - lo


@triton.jit(do_not_specialize=["n_exp"])
def expert_order_kernel(ENDS, ORDER, n_exp, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr):
    """``ORDER`` int32 ``[n_exp]``: the experts by row count, most rows first, ties in index
    order (``torch.sort(rows, descending=True, stable=True).indices``): expert e goes to
    position ``#{e' : rows[e'] > rows[e]} + #{e' < e : rows[e'] == rows[e]}`` (a
    permutation: each position written once). Grid: blocks of ``BLOCK_E`` experts."""
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    m = e < n_exp
    r = _rows_of(ENDS, e, m)
    rank = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c0 in range(0, n_exp, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cm = c < n_exp
        rc = _rows_of(ENDS, c, cm)
        ahead = (rc[None, :] > r[:, None]) | ((rc[None, :] == r[:, None]) &
                                               (c[None, :] < e[:, None]))
        rank += tl.sum((ahead & cm[None, :]).to(tl.int32), axis=1)
    tl.store(ORDER + rank, e.to(tl.int32), mask=m)
