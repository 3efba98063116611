"""Device helpers shared by the mHC kernels: fp32 dots, log-domain Sinkhorn forward and
backward on a block of ``[BT, n, n]`` matrices, the per-token logits.

Sinkhorn in the log domain (potentials). Start from M = exp(L) (L = h_res, rows j = output
stream, columns i = input stream). One iteration divides every row by its sum, then every
column by its sum. After t iterations M_t = exp(L - f_t[j] - g_t[i]) with

    f_t[j] = logsumexp_i(L[j, i] - g_{t-1}[i])   (g_0 = 0)   row normalization
    g_t[i] = logsumexp_j(L[j, i] - f_t[j])                    column normalization

which is the same sequence of matrices as the divisions, exactly in real arithmetic. No
exp(L) is ever formed, so logits of any size (+-50 and beyond) neither overflow nor lose a
column to underflow. The backward replays the potentials (kept in ``[BT, IP, n]`` register
tiles, IP >= iterations + 1) and walks them in reverse:

    dL = dH * H;  df = -rowsum(dH * H);  dg = -colsum(dH * H)
    for t = T..1:
        Q = exp(L - f_t - g_t):      dL += Q * dg;  df -= rowsum(Q * dg)
        R = exp(L - f_t - g_{t-1}):  dL += R * df;  dg = -colsum(R * df);  df = 0
"""

import triton
import triton.language as tl
from cake_core.triton_utils import INTERPRETING


@triton.jit
def mma(a, b, acc, PREC: tl.constexpr):
    """``acc + a @ b`` with fp32 operands (``PREC``: tf32, ieee or tf32x3 on CUDA; exact fp32
    under the interpreter)."""
    if INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)


@triton.jit
def row_lse(L, g):
    """f[b, j] = logsumexp_i(L[b, j, i] - g[b, i])."""
    a = L - g[:, None, :]
    mx = tl.max(a, axis=2)
    return mx + tl.log(tl.sum(tl.exp(a - mx[:, :, None]), axis=2))


@triton.jit
def col_lse(L, f):
    """g[b, i] = logsumexp_j(L[b, j, i] - f[b, j])."""
    a = L - f[:, :, None]
    mx = tl.max(a, axis=1)
    return mx + tl.log(tl.sum(tl.exp(a - mx[:, None, :]), axis=1))


@triton.jit
def sinkhorn_fwd(L, ITERS: tl.constexpr, BT: tl.constexpr, N: tl.constexpr):
    """H = Sinkhorn-Knopp(exp(L)) after ITERS row-then-column iterations, ``[BT, N, N]``."""
    g = tl.zeros([BT, N], dtype=tl.float32)
    f = tl.zeros([BT, N], dtype=tl.float32)
    for _ in range(ITERS):
        f = row_lse(L, g)
        g = col_lse(L, f)
    return tl.exp(L - f[:, :, None] - g[:, None, :])


@triton.jit
def _pick(hist, idx, t):
    """hist[:, t, :] of a ``[BT, IP, N]`` tile (a masked sum: no gather needed)."""
    return tl.sum(tl.where(idx == t, hist, 0.0), axis=1)


@triton.jit
def sinkhorn_bwd(L, dH, ITERS: tl.constexpr, BT: tl.constexpr, N: tl.constexpr,
                 IP: tl.constexpr):
    """dL for H = sinkhorn_fwd(L), through every iteration (replayed potentials)."""
    idx = tl.arange(0, IP)[None, :, None]
    g = tl.zeros([BT, N], dtype=tl.float32)
    f = tl.zeros([BT, N], dtype=tl.float32)
    F = tl.zeros([BT, IP, N], dtype=tl.float32)
    G = tl.zeros([BT, IP, N], dtype=tl.float32)  # G[:, 0] = g_0 = 0
    for t in range(1, ITERS + 1):
        f = row_lse(L, g)
        F = tl.where(idx == t, f[:, None, :], F)
        g = col_lse(L, f)
        G = tl.where(idx == t, g[:, None, :], G)
    H = tl.exp(L - f[:, :, None] - g[:, None, :])
    P = dH * H
    dL = P
    df = -tl.sum(P, axis=2)
    dg = -tl.sum(P, axis=1)
    for s in range(ITERS):
        t = ITERS - s
        ft = _pick(F, idx, t)
        gt = _pick(G, idx, t)
        gp = _pick(G, idx, t - 1)
        Q = tl.exp(L - ft[:, :, None] - gt[:, None, :]) * dg[:, None, :]
        dL += Q
        df = df - tl.sum(Q, axis=2)
        R = tl.exp(L - ft[:, :, None] - gp[:, None, :]) * df[:, :, None]
        dL += R
        dg = -tl.sum(R, axis=1)
        df = tl.zeros([BT, N], dtype=tl.float32)
    return dL


@triton.jit
def load_logits(MIX, ALPHA, BIAS, t, tmask, N: tl.constexpr, M: tl.constexpr):
    """Raw projections and logits of a token block: (mix_pre, mix_post, mix_res, h_pre,
    h_post, h_res) with shapes [BT, N], [BT, N], [BT, N, N] (res: rows j, columns i)."""
    j = tl.arange(0, N)
    jj = tl.arange(0, N)[None, :, None]
    ii = tl.arange(0, N)[None, None, :]
    a_pre = tl.load(ALPHA + 0)
    a_post = tl.load(ALPHA + 1)
    a_res = tl.load(ALPHA + 2)
    row = MIX + t[:, None] * M
    m_pre = tl.load(row + j[None, :], mask=tmask[:, None], other=0.0)
    m_post = tl.load(row + N + j[None, :], mask=tmask[:, None], other=0.0)
    r_off = 2 * N + jj * N + ii
    m_res = tl.load(MIX + t[:, None, None] * M + r_off, mask=tmask[:, None, None], other=0.0)
    h_pre = a_pre * m_pre + tl.load(BIAS + j)[None, :]
    h_post = a_post * m_post + tl.load(BIAS + N + j)[None, :]
    h_res = a_res * m_res + tl.load(BIAS + r_off)
    return m_pre, m_post, m_res, h_pre, h_post, h_res


@triton.jit
def column(v, j, i):
    """v[:, i] of a ``[BT, N]`` tile as ``[BT]`` (masked sum)."""
    return tl.sum(tl.where(j[None, :] == i, v, 0.0), axis=1)
