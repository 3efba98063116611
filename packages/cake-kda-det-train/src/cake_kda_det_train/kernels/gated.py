"""Per-channel gated pair products inside one chunk, without overflow (jit helpers).

For a chunk of ``BT`` tokens with within-chunk cumulative log decays ``G`` ``[BT, BK]``
(non-increasing down the rows when every g <= 0), the KDA chunk form needs, for j <= i,

    pair(L, R)[i, j]   = sum_c L[i, c] R[j, c] exp(G[i, c] - G[j, c])
    row_apply(P, R)[i] = sum_j P[i, j] R[j, :] * exp(G[i, :] - G[j, :])
    col_apply(P, L)[j] = sum_i P[i, j] L[i, :] * exp(G[i, :] - G[j, :])

exp(G_i - G_j) itself never overflows (j <= i), but the factored form
(L exp(G)) (R exp(-G))^T that a single dot needs does when decays are strong (g down to
-20 per token gives exp(+1280)). So the chunk is cut into sub-chunks of ``BC`` rows:

- pairs in different sub-chunks use one dot per sub-chunk with a per-channel reference r
  taken between them (the last row before row i's sub-chunk for ``pair``/``row_apply``, the
  last row of column j's sub-chunk for ``col_apply``): L exp(G_i - r) and R exp(r - G_j)
  both have exponents <= 0;
- pairs inside one sub-chunk are summed elementwise, one partner offset per step, with
  the exponent G_i - G_j <= 0 masked before exp.

Exponents are masked before ``exp`` everywhere, so no inf or NaN arises from the masked
side. Every sum runs in a fixed order (the dots' K loop, then the steps in index order).
``DT`` is the dots' operand dtype, ``PREC`` their fp32 precision.
"""

import triton
import triton.language as tl


@triton.jit
def _row_at(X, rows, r):
    """Row ``r`` of ``X`` ``[BT, BK]`` as a ``[BK]`` vector."""
    return tl.sum(tl.where(rows[:, None] == r, X, 0.0), axis=0)


@triton.jit
def _partner(X, jj, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """``Y[i] = X[BC * (i // BC) + jj]``: each row's partner at offset jj of its sub-chunk."""
    x3 = tl.reshape(X, (BT // BC, BC, BK))
    sub = tl.arange(0, BC)
    sel = tl.sum(tl.where(sub[None, :, None] == jj, x3, 0.0), axis=1)
    return tl.reshape(tl.broadcast_to(sel[:, None, :], (BT // BC, BC, BK)), (BT, BK))


@triton.jit
def gated_pair(L, R, G, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
               BC: tl.constexpr, BK: tl.constexpr, INCL: tl.constexpr):
    """``[BT, BT]`` fp32: ``sum_c L_i R_j exp(G_i - G_j)`` for j < i (j <= i with INCL),
    0 elsewhere."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    m = tl.zeros([BT, BT], dtype=tl.float32)
    for b in tl.static_range(1, BT // BC):
        r = _row_at(G, rows, b * BC - 1)
        inb = (blk == b)[:, None]
        left = tl.where(inb, L * tl.exp(tl.where(inb, G - r[None, :], 0.0)), 0.0)
        before = (rows < b * BC)[:, None]
        right = tl.where(before, R * tl.exp(tl.where(before, r[None, :] - G, 0.0)), 0.0)
        m = tl.dot(left.to(DT), tl.trans(right.to(DT)), m, input_precision=PREC)
    for jj in range(BC):
        rj = _partner(R, jj, BT, BC, BK)
        gj = _partner(G, jj, BT, BC, BK)
        if INCL:
            valid = ((rows % BC) >= jj)[:, None]
        else:
            valid = ((rows % BC) > jj)[:, None]
        val = tl.sum(tl.where(valid, L * rj * tl.exp(tl.where(valid, G - gj, 0.0)), 0.0),
                     axis=1)
        m += tl.where(rows[None, :] == (blk * BC + jj)[:, None], val[:, None], 0.0)
    return m


@triton.jit
def row_apply(P, R, G, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr, BK: tl.constexpr):
    """``[BT, BK]`` fp32: row i is ``sum_j P[i, j] R_j exp(G_i - G_j)``; P ``[BT, BT]`` must
    be 0 above the diagonal."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    out = tl.zeros([BT, BK], dtype=tl.float32)
    for b in tl.static_range(1, BT // BC):
        r = _row_at(G, rows, b * BC - 1)
        before = (rows < b * BC)[:, None]
        right = tl.where(before, R * tl.exp(tl.where(before, r[None, :] - G, 0.0)), 0.0)
        t = tl.zeros([BT, BK], dtype=tl.float32)
        t = tl.dot(P.to(DT), right.to(DT), t, input_precision=PREC)
        inb = (blk == b)[:, None]
        out += tl.where(inb, tl.exp(tl.where(inb, G - r[None, :], 0.0)) * t, 0.0)
    for jj in range(BC):
        pj = tl.sum(tl.where(rows[None, :] == (blk * BC + jj)[:, None], P, 0.0), axis=1)
        rj = _partner(R, jj, BT, BC, BK)
        gj = _partner(G, jj, BT, BC, BK)
        valid = ((rows % BC) >= jj)[:, None]
        out += tl.where(valid, pj[:, None] * rj * tl.exp(tl.where(valid, G - gj, 0.0)), 0.0)
    return out


@triton.jit
def col_apply(P, L, G, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr, BK: tl.constexpr):
    """``[BT, BK]`` fp32: row j is ``sum_i P[i, j] L_i exp(G_i - G_j)``; P ``[BT, BT]`` must
    be 0 above the diagonal."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    out = tl.zeros([BT, BK], dtype=tl.float32)
    pt = tl.trans(P)
    for b in tl.static_range(0, BT // BC - 1):
        r = _row_at(G, rows, b * BC + BC - 1)
        after = (rows >= (b + 1) * BC)[:, None]
        left = tl.where(after, L * tl.exp(tl.where(after, G - r[None, :], 0.0)), 0.0)
        t = tl.zeros([BT, BK], dtype=tl.float32)
        t = tl.dot(pt.to(DT), left.to(DT), t, input_precision=PREC)
        inb = (blk == b)[:, None]
        out += tl.where(inb, tl.exp(tl.where(inb, r[None, :] - G, 0.0)) * t, 0.0)
    for ii in range(BC):
        # pi[j] = P[BC * (j // BC) + ii, j]
        pi = tl.sum(tl.where(rows[None, :] == (blk * BC + ii)[:, None], pt, 0.0), axis=1)
        li = _partner(L, ii, BT, BC, BK)
        gi = _partner(G, ii, BT, BC, BK)
        valid = (ii >= (rows % BC))[:, None]
        out += tl.where(valid, pi[:, None] * li * tl.exp(tl.where(valid, gi - G, 0.0)), 0.0)
    return out


# --- plan.diag_load = 1: the intra-sub-chunk partners loaded from memory --------------------
#
# Same sums as gated_pair / row_apply / col_apply, term by term and in the same order, but
# the partner row of each step (R or L, and G, at offset jj of the row's sub-chunk) is a
# gathered load of that token's row (``base + tok * stride + ck``; L1/L2-resident: the
# program has just read it) instead of a selection out of the register tile (a 3-D reshape,
# a masked sum over the sub-chunk and a broadcast back: layout conversions through shared
# memory, BT * BC * BK work per step where a load is BT * BK). Pairs whose partner token is
# at or past ``end`` are masked (their terms are 0 in the register version too).


@triton.jit
def _partner_load(base, stride, ptok, ck, KD, end):
    """``[BT, BK]`` fp32: row i is the row of token ``ptok[i]`` (0 past ``end`` or K)."""
    m = (ptok < end)[:, None] & (ck < KD)[None, :]
    return tl.load(base + ptok[:, None] * stride + ck[None, :], mask=m, other=0.0).to(
        tl.float32)


@triton.jit
def gated_pair_ld(L, R, G, RB, r_stride, GB, g_stride, ck, KD, start, end,
                  DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                  BK: tl.constexpr, INCL: tl.constexpr):
    """:func:`gated_pair` with the partner rows of R (token rows at ``RB``) and G (at
    ``GB``) loaded; the sub-chunk terms are gathered in their own ``[BT, BT]`` tile (each
    entry receives one term, so the sum is the same) and added once."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    m = tl.zeros([BT, BT], dtype=tl.float32)
    for b in tl.static_range(1, BT // BC):
        r = _row_at(G, rows, b * BC - 1)
        inb = (blk == b)[:, None]
        left = tl.where(inb, L * tl.exp(tl.where(inb, G - r[None, :], 0.0)), 0.0)
        before = (rows < b * BC)[:, None]
        right = tl.where(before, R * tl.exp(tl.where(before, r[None, :] - G, 0.0)), 0.0)
        m = tl.dot(left.to(DT), tl.trans(right.to(DT)), m, input_precision=PREC)
    md = tl.zeros([BT, BT], dtype=tl.float32)
    for jj in range(BC):
        ptok = start + blk * BC + jj
        rj = _partner_load(RB, r_stride, ptok, ck, KD, end)
        gj = _partner_load(GB, g_stride, ptok, ck, KD, end)
        if INCL:
            valid = (((rows % BC) >= jj) & (ptok < end))[:, None]
        else:
            valid = (((rows % BC) > jj) & (ptok < end))[:, None]
        val = tl.sum(tl.where(valid, L * rj * tl.exp(tl.where(valid, G - gj, 0.0)), 0.0),
                     axis=1)
        md += tl.where(rows[None, :] == (blk * BC + jj)[:, None], val[:, None], 0.0)
    return m + md


@triton.jit
def row_apply_ld(P, R, G, RB, r_stride, GB, g_stride, ck, KD, start, end, PB, p_stride,
                 DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                 BK: tl.constexpr, P_LOAD: tl.constexpr):
    """:func:`row_apply` with the partner rows of R and G loaded (same terms, same order);
    with ``P_LOAD`` each step's entries ``P[i, BC * (i // BC) + jj]`` are loaded too, from
    a copy of P at ``PB`` (row = token, ``p_stride`` apart; rows past ``end`` are 0 in P)
    instead of a masked row sum over the ``[BT, BT]`` register tile."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    out = tl.zeros([BT, BK], dtype=tl.float32)
    for b in tl.static_range(1, BT // BC):
        r = _row_at(G, rows, b * BC - 1)
        before = (rows < b * BC)[:, None]
        right = tl.where(before, R * tl.exp(tl.where(before, r[None, :] - G, 0.0)), 0.0)
        t = tl.zeros([BT, BK], dtype=tl.float32)
        t = tl.dot(P.to(DT), right.to(DT), t, input_precision=PREC)
        inb = (blk == b)[:, None]
        out += tl.where(inb, tl.exp(tl.where(inb, G - r[None, :], 0.0)) * t, 0.0)
    for jj in range(BC):
        if P_LOAD:
            tok = start + rows
            pj = tl.load(PB + tok * p_stride + blk * BC + jj, mask=tok < end, other=0.0)
        else:
            pj = tl.sum(tl.where(rows[None, :] == (blk * BC + jj)[:, None], P, 0.0), axis=1)
        ptok = start + blk * BC + jj
        rj = _partner_load(RB, r_stride, ptok, ck, KD, end)
        gj = _partner_load(GB, g_stride, ptok, ck, KD, end)
        valid = (((rows % BC) >= jj) & (ptok < end))[:, None]
        out += tl.where(valid, pj[:, None] * rj * tl.exp(tl.where(valid, G - gj, 0.0)), 0.0)
    return out


@triton.jit
def col_apply_ld(P, L, G, LB, l_stride, GB, g_stride, ck, KD, start, end, PB, p_stride,
                 BB, b_stride, DT: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, P_LOAD: tl.constexpr,
                 P_BETA: tl.constexpr):
    """:func:`col_apply` with the partner rows of L and G loaded (same terms, same order);
    with ``P_LOAD`` each step's entries ``P[BC * (j // BC) + ii, j]`` are loaded from a
    copy at ``PB`` (as :func:`row_apply_ld`), times the row's beta (at ``BB``, ``b_stride``
    apart) when ``P_BETA`` (P = diag(beta) X with X the copy: the same fp32 product)."""
    rows = tl.arange(0, BT)
    blk = rows // BC
    out = tl.zeros([BT, BK], dtype=tl.float32)
    pt = tl.trans(P)
    for b in tl.static_range(0, BT // BC - 1):
        r = _row_at(G, rows, b * BC + BC - 1)
        after = (rows >= (b + 1) * BC)[:, None]
        left = tl.where(after, L * tl.exp(tl.where(after, G - r[None, :], 0.0)), 0.0)
        t = tl.zeros([BT, BK], dtype=tl.float32)
        t = tl.dot(pt.to(DT), left.to(DT), t, input_precision=PREC)
        inb = (blk == b)[:, None]
        out += tl.where(inb, tl.exp(tl.where(inb, r[None, :] - G, 0.0)) * t, 0.0)
    for ii in range(BC):
        ptok = start + blk * BC + ii
        if P_LOAD:
            pi = tl.load(PB + ptok * p_stride + rows, mask=ptok < end, other=0.0)
            if P_BETA:
                pi = pi * tl.load(BB + ptok * b_stride, mask=ptok < end, other=0.0).to(
                    tl.float32)
        else:
            pi = tl.sum(tl.where(rows[None, :] == (blk * BC + ii)[:, None], pt, 0.0), axis=1)
        li = _partner_load(LB, l_stride, ptok, ck, KD, end)
        gi = _partner_load(GB, g_stride, ptok, ck, KD, end)
        valid = ((ii >= (rows % BC)) & (ptok < end))[:, None]
        out += tl.where(valid, pi[:, None] * li * tl.exp(tl.where(valid, gi - G, 0.0)), 0.0)
    return out
