"""Per-chunk softmax / cross entropy: logsumexp over V in fixed blocks, loss, dlogits.

One program owns BLOCK_M rows of the chunk's fp32 logits ``[n_rows, V]`` and walks the
vocabulary in fixed BLOCK_V steps in increasing order (online max / sum-exp), so every
row's lse is a fixed sequence of fp32 operations. With s the (soft-capped) logits,
p = softmax(s), eps the label smoothing, zl the z-loss coefficient and y the label:

    loss   = lse - (1 - eps) s_y - eps/V sum_j s_j + zl lse^2      (0 for ignored rows)
    dL/ds  = p (1 + 2 zl lse) - (1 - eps) [j == y] - eps/V
    dlogit = g * dL/ds * (1 - (s/c)^2)    (soft-cap c: s = c tanh(z/c); else the factor is 1)

g is the row's upstream gradient: 1 (FWD with GRAD: grad in forward), one scalar, or one per
token, divided by max(n_valid, 1) for "mean"; 0 for ignored rows. Labels are compared, never
used as addresses, so an unchecked out-of-range label cannot read out of bounds; its row's loss
and dlogits are NaN (a label outside [0, V) other than ignore_index shows in the loss, with no
host sync). No atomics.
"""

import triton
import triton.language as tl
from cake_core.triton_utils import tanh


@triton.jit(do_not_specialize=["n_rows", "ignore_index"])
def ce_chunk_kernel(
    LOGITS, DLOGITS, LABELS, LOSS, LSE, G, NVALID,
    n_rows, n_vocab, stride_l, stride_d, ignore_index, label_smoothing, z_loss, softcap,
    FWD: tl.constexpr, GRAD: tl.constexpr, G_KIND: tl.constexpr, MEAN: tl.constexpr,
    SOFTCAP: tl.constexpr, STORE_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """FWD: write LOSS and LSE of the rows. GRAD: write DLOGITS (its dtype) from the lse
    (computed, or read from LSE without FWD); STORE_F32 also writes the fp32 dlogits over
    LOGITS (for the ordered dbias sum). G_KIND: 0 g = 1, 1 scalar G[0], 2 per row G[row]."""
    pid = tl.program_id(0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < n_rows
    y = tl.load(LABELS + rows, mask=rmask, other=ignore_index)
    valid = rmask & (y != ignore_index)
    bad = valid & ((y < 0) | (y >= n_vocab))  # out of range: NaN loss and dlogits
    cols0 = tl.arange(0, BLOCK_V)
    if FWD:
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        se = tl.zeros([BLOCK_M], dtype=tl.float32)
        sy = tl.zeros([BLOCK_M], dtype=tl.float32)
        ssum = tl.zeros([BLOCK_M], dtype=tl.float32)
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + cols0
            cmask = cols < n_vocab
            mask = rmask[:, None] & cmask[None, :]
            z = tl.load(LOGITS + rows[:, None] * stride_l + cols[None, :], mask=mask, other=0.0)
            if SOFTCAP:
                z = softcap * tanh(z / softcap)
            zm = tl.where(cmask[None, :], z, float("-inf"))
            m_new = tl.maximum(m, tl.max(zm, axis=1))
            se = se * tl.exp(m - m_new) + tl.sum(tl.exp(zm - m_new[:, None]), axis=1)
            m = m_new
            sy += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), axis=1)
            ssum += tl.sum(tl.where(mask, z, 0.0), axis=1)
        lse = m + tl.log(se)
        loss = lse - (1.0 - label_smoothing) * sy - (label_smoothing / n_vocab) * ssum
        loss += z_loss * lse * lse
        loss = tl.where(valid, loss, 0.0)
        loss = tl.where(bad, float("nan"), loss)
        tl.store(LOSS + rows, loss, mask=rmask)
        tl.store(LSE + rows, lse, mask=rmask)
    else:
        lse = tl.load(LSE + rows, mask=rmask, other=0.0)
    if GRAD:
        if G_KIND == 0:
            g = tl.full([BLOCK_M], 1.0, tl.float32)
        elif G_KIND == 1:
            g = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(G).to(tl.float32)
        else:
            g = tl.load(G + rows, mask=rmask, other=0.0).to(tl.float32)
        if MEAN:
            n = tl.maximum(tl.load(NVALID), 1).to(tl.float32)
            g = g / n
        coef = 1.0 + 2.0 * z_loss * lse
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + cols0
            cmask = cols < n_vocab
            mask = rmask[:, None] & cmask[None, :]
            z = tl.load(LOGITS + rows[:, None] * stride_l + cols[None, :], mask=mask, other=0.0)
            if SOFTCAP:
                t = tanh(z / softcap)
                z = softcap * t
            p = tl.exp(z - lse[:, None])
            d = p * coef[:, None] - label_smoothing / n_vocab
            d = d - tl.where(cols[None, :] == y[:, None], 1.0 - label_smoothing, 0.0)
            if SOFTCAP:
                d = d * (1.0 - t * t)
            d = tl.where(valid[:, None], d * g[:, None], 0.0)
            d = tl.where(bad[:, None], float("nan"), d)
            tl.store(DLOGITS + rows[:, None] * stride_d + cols[None, :],
                     d.to(DLOGITS.dtype.element_ty), mask=mask)
            if STORE_F32:
                tl.store(LOGITS + rows[:, None] * stride_l + cols[None, :], d, mask=mask)
