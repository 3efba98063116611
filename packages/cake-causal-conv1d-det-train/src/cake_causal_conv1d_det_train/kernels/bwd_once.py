"""Backward with the SiLU derivative computed once per row (plan.bwd_da_once = 1, SiLU only).

The same outputs as bwd.py's kernel (dx per tile, d(initial_state) per sequence, one fp32
partial dweight / dbias row per token block, summed over the blocks in index order by the
host), but dpre = dy * silu'(pre) is formed once per row instead of once per output shift:

- the tile's own rows t (``BLOCK_T``) and its W - 1 halo rows t + BLOCK_T .. (a ``BW``-row
  tile, the rows past W - 1 masked) each get pre recomputed tap by tap in the forward's
  order (common.py: x taps, then the state's taps in a sequence's first rows), then dpre
  (rows past the sequence end: dy reads 0, so dpre = 0: nothing leaks from the next
  document);
- both are written to the program's fp32 scratch rows ``[BLOCK_T + BW, BLOCK_D]`` (global
  memory; one slot per program, reused tile after tile, so it stays in L2), a barrier, and
  the shifts k = 1 .. W - 1 read dpre[t + k] back as shifted row views (Triton has no
  cross-row register shuffle);
- the per-shift sums keep bwd.py's order (k = 0, 1, ..., W - 1 for dx and the dweight tap
  W - 1 - k; the bias partial from k = 0), and each dpre is the same fp32 value bwd.py
  recomputes, so the bits equal the default plan's under the interpreter.

Persistent: ``n_prog`` programs (the scratch's slots) walk the (token block, channel block)
tiles pid, pid + n_prog, ...; a barrier before each scratch write keeps the previous tile's
reads first. Tiles are independent (own dx rows, own partial rows), so the order in which
programs take them changes no bit. The sequence's first block also writes d(initial_state)
exactly as bwd.py (its W - 1 outputs' dpre recomputed there, a small [BW, BLOCK_D] tile).
"""

import triton
import triton.language as tl

from cake_causal_conv1d_det_train.kernels.common import (
    add_state_taps,
    block_origin,
    round_bf16,
    silu_grad,
    state_grads,
)


@triton.jit
def _dpre_rows(X, WT, H0, DY, b, r, rmask, x_off, dy_off, n, cols, cmask, L, first,
               stride_xt, stride_w, stride_wk, stride_dyt, s_hn, s_hd, s_hk,
               W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """dy * silu'(pre) at the rows ``r`` (``rmask``: rows to compute; 0 elsewhere), pre as the
    forward sums it; ``first``: the rows' first is below W - 1 (the state's taps may reach)."""
    pre = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        pre += b[None, :]
    for i in tl.static_range(W):
        p = r + (i - (W - 1))
        xi = tl.load(X + x_off + p[:, None] * stride_xt + cols[None, :],
                     mask=(rmask & (p >= 0) & (p < L))[:, None] & cmask[None, :], other=0.0)
        wi = tl.load(WT + cols * stride_w + i * stride_wk, mask=cmask, other=0.0).to(tl.float32)
        pre += wi[None, :] * xi.to(tl.float32)
    if HAS_H0:
        if first:
            pre = add_state_taps(pre, H0, WT, n, r, rmask, cols, cmask, s_hn, s_hd, s_hk,
                                 stride_w, stride_wk, W, True)
    dy = tl.load(DY + dy_off + r[:, None] * stride_dyt + cols[None, :],
                 mask=(rmask & (r < L))[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    return silu_grad(dy, pre)


@triton.jit(do_not_specialize=["T", "n_blk_seq", "n_tiles"])
def causal_conv1d_bwd_once_kernel(
    X, WT, BIAS, H0, DY, DHT, DX, DH0, DWP, DBP, TABLE, CU, SCR,
    T, D, n_blk_seq, n_cb, n_tiles, stride_xb, stride_xt, stride_w, stride_wk, s_hn, s_hd,
    s_hk, stride_dyb, stride_dyt, s_tn, s_td, s_tk,
    W: tl.constexpr, BW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr,
    HAS_DHT: tl.constexpr, VARLEN: tl.constexpr, RNE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    s_r = tl.arange(0, BLOCK_T)
    s_c = tl.arange(0, BLOCK_D)
    h_j = tl.arange(0, BW)  # halo row j: t = start + BLOCK_T + j, j < W - 1
    scr = SCR + pid.to(tl.int64) * ((BLOCK_T + BW) * BLOCK_D)
    taps = tl.arange(0, BW)
    for tile in range(pid, n_tiles, n_prog):
        g = (tile // n_cb).to(tl.int64)
        cb = tile % n_cb
        n, start, L, x_off, dy_off, dx_off = block_origin(g, TABLE, CU, T, D, n_blk_seq,
                                                          stride_xb, stride_xt, stride_dyb,
                                                          stride_dyt, VARLEN, BLOCK_T)
        cols = cb * BLOCK_D + tl.arange(0, BLOCK_D)
        cmask = cols < D
        if HAS_BIAS:
            b = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
        else:
            b = tl.zeros([BLOCK_D], dtype=tl.float32)  # never added (HAS_BIAS guards every use)
        rows = start + s_r.to(tl.int64)
        h_rows = start + BLOCK_T + h_j.to(tl.int64)
        x_own = tl.load(X + x_off + rows[:, None] * stride_xt + cols[None, :],
                        mask=(rows < L)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        dpre = _dpre_rows(X, WT, H0, DY, b, rows, rows >= 0, x_off, dy_off, n, cols, cmask, L,
                          start < W - 1, stride_xt, stride_w, stride_wk, stride_dyt, s_hn,
                          s_hd, s_hk, W, HAS_BIAS, HAS_H0, BLOCK_T, BLOCK_D)
        h_dpre = _dpre_rows(X, WT, H0, DY, b, h_rows, h_j < W - 1, x_off, dy_off, n, cols,
                            cmask, L, start + BLOCK_T < W - 1, stride_xt, stride_w, stride_wk,
                            stride_dyt, s_hn, s_hd, s_hk, W, HAS_BIAS, HAS_H0, BW, BLOCK_D)
        tl.debug_barrier()  # the previous tile's scratch reads come first
        tl.store(scr + s_r[:, None] * BLOCK_D + s_c[None, :], dpre)
        tl.store(scr + (BLOCK_T + h_j)[:, None] * BLOCK_D + s_c[None, :], h_dpre)
        tl.debug_barrier()  # the stores are visible to every thread of the program
        dx = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        dw = tl.zeros([BW, BLOCK_D], dtype=tl.float32)
        for k in tl.static_range(W):
            if k == 0:
                d_k = dpre
                if HAS_BIAS:
                    tl.store(DBP + g * D + cols, tl.sum(dpre, axis=0), mask=cmask)
            else:  # dpre[t + k]: row s_r + k of the scratch (the halo from row BLOCK_T on)
                d_k = tl.load(scr + (s_r + k)[:, None] * BLOCK_D + s_c[None, :])
            # x[t] is tap W - 1 - k of the output t + k
            dw += tl.where((taps == W - 1 - k)[:, None], tl.sum(d_k * x_own, axis=0)[None, :],
                           0.0)
            wk = tl.load(WT + cols * stride_w + (W - 1 - k) * stride_wk, mask=cmask,
                         other=0.0).to(tl.float32)
            dx += d_k * wk[None, :]
        if HAS_DHT:
            j = rows - L + (W - 1)
            m = ((j >= 0) & (rows < L))[:, None] & cmask[None, :]
            dx += tl.load(DHT + n * s_tn + cols[None, :] * s_td + j[:, None] * s_tk, mask=m,
                          other=0.0).to(tl.float32)
        if RNE:
            dx = round_bf16(dx)
        mask = (rows < L)[:, None] & cmask[None, :]
        tl.store(DX + dx_off + rows[:, None] * D + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=mask)
        if HAS_H0:
            if start == 0:  # the sequence's first block: d(initial_state), as in bwd.py
                h_r = tl.arange(0, BW).to(tl.int64)  # slot k of the state, or output u
                h_rmask = h_r < W - 1
                h_d = _dpre_rows(X, WT, H0, DY, b, h_r, h_rmask, x_off, dy_off, n, cols,
                                 cmask, L, True, stride_xt, stride_w, stride_wk, stride_dyt,
                                 s_hn, s_hd, s_hk, W, HAS_BIAS, HAS_H0, BW, BLOCK_D)
                dw = state_grads(h_d, dw, h_r, h_rmask, taps, H0, WT, DHT, DH0, n, L, D,
                                 cols, cmask, stride_w, stride_wk, s_hn, s_hd, s_hk, s_tn,
                                 s_td, s_tk, W, HAS_DHT, RNE)
        tl.store(DWP + g * D * W + cols[None, :] * W + taps[:, None], dw,
                 mask=(taps < W)[:, None] & cmask[None, :])
