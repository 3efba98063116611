"""Backward of mhc_det_prepare.

``mhc_bwd_coef_kernel`` (one program per BLOCK_T tokens): dH_pre[t, i] = sum_c dU[t, c]
X[t, i, c] (+ the incoming dCOEF pre part), then the logits' gradients dh_pre = dH_pre *
s(1 - s), dh_post = dH_post * 2 s(1 - s), dh_res = Sinkhorn backward (replayed, common.py);
dmix = alpha_g * dh_g. It writes DZ[t] = rstd[t] * dmix[t] (the gradient of x·phi),
CX[t] = -sum_m(dmix * mix) * rstd^2 / (n C) (the RMS term of dX, times x), and one fp32
partial row per program PB[pid] = [sum_t dh (2n + n^2), sum_t sum_{m in g} dh * mix (3)]
(an in-tile tree over its BLOCK_T tokens); the rows are summed in program order later.

``mhc_bwd_dx_kernel`` (one program per (stream i, BLOCK_C channels, token slice s)):
dX[t, i, c] = DZ[t] @ phi[i C + c]^T + H_pre[t, i] dU[t, c] + CX[t] X[t, i, c]
(+ DX_IN[t, i, c], the finish's part), and the slice's partial of dphi over the same
rows: PART[s, i C + c] = sum over the slice's tokens of X[t, i, c]^T DZ[t] (fp32, token
blocks s, s + S, ... in increasing order). No atomics.

``rows_sum_kernel``: OUT[w] = sum_r P[r, w] in fixed steps of BLOCK_R rows (in-tile tree
within a step, steps in increasing order), fp32.
"""

import triton
import triton.language as tl

from cake_mhc_det_train.kernels.common import load_logits, mma, sinkhorn_bwd


@triton.jit(do_not_specialize=["n_tok"])
def mhc_bwd_coef_kernel(
    X, DU, MIX, RSTD, ALPHA, BIAS, DCOEF, DZ, CX, PB,
    n_tok, C, stride_xt, stride_xi, stride_dut,
    N: tl.constexpr, M: tl.constexpr, ITERS: tl.constexpr, IP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, HAS_DCOEF: tl.constexpr,
):
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    j = tl.arange(0, N)
    jj = tl.arange(0, N)[None, :, None]
    ii = tl.arange(0, N)[None, None, :]
    r_off = 2 * N + jj * N + ii
    m_pre, m_post, m_res, h_pre, h_post, h_res = load_logits(MIX, ALPHA, BIAS, t, tm, N, M)
    # dH_pre from U = sum_i H_pre[i] X[i]
    d_pre = tl.zeros([BLOCK_T, N], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        msk = tm[:, None] & (c < C)[None, :]
        du = tl.load(DU + t[:, None] * stride_dut + c[None, :], mask=msk, other=0.0)
        du = du.to(tl.float32)
        for i in tl.static_range(N):
            x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :], mask=msk,
                        other=0.0).to(tl.float32)
            d_pre += tl.where(j[None, :] == i, tl.sum(du * x, axis=1)[:, None], 0.0)
    if HAS_DCOEF:
        row = DCOEF + t[:, None] * M
        d_pre += tl.load(row + j[None, :], mask=tm[:, None], other=0.0)
        d_post = tl.load(row + N + j[None, :], mask=tm[:, None], other=0.0)
        d_res = tl.load(DCOEF + t[:, None, None] * M + r_off, mask=tm[:, None, None],
                        other=0.0)
    else:
        d_post = tl.zeros([BLOCK_T, N], dtype=tl.float32)
        d_res = tl.zeros([BLOCK_T, N, N], dtype=tl.float32)
    s_pre = tl.sigmoid(h_pre)
    s_post = tl.sigmoid(h_post)
    dh_pre = tl.where(tm[:, None], d_pre * s_pre * (1.0 - s_pre), 0.0)
    dh_post = tl.where(tm[:, None], d_post * 2.0 * s_post * (1.0 - s_post), 0.0)
    dh_res = sinkhorn_bwd(h_res, d_res, ITERS, BLOCK_T, N, IP)
    dh_res = tl.where(tm[:, None, None], dh_res, 0.0)
    # per-program partials of dbias and dalpha
    W = M + 3
    pb = PB + pid.to(tl.int64) * W
    tl.store(pb + j, tl.sum(dh_pre, axis=0))
    tl.store(pb + N + j, tl.sum(dh_post, axis=0))
    tl.store(pb + 2 * N + tl.arange(0, N)[:, None] * N + tl.arange(0, N)[None, :],
             tl.sum(dh_res, axis=0))
    tl.store(pb + M, tl.sum(tl.sum(dh_pre * m_pre, axis=1), axis=0))
    tl.store(pb + M + 1, tl.sum(tl.sum(dh_post * m_post, axis=1), axis=0))
    tl.store(pb + M + 2, tl.sum(tl.sum(tl.sum(dh_res * m_res, axis=2), axis=1), axis=0))
    # through mix = rstd * (x @ phi)
    a_pre = tl.load(ALPHA + 0)
    a_post = tl.load(ALPHA + 1)
    a_res = tl.load(ALPHA + 2)
    dm_pre = a_pre * dh_pre
    dm_post = a_post * dh_post
    dm_res = a_res * dh_res
    rstd = tl.load(RSTD + t, mask=tm, other=0.0)
    row = DZ + t[:, None] * M
    tl.store(row + j[None, :], dm_pre * rstd[:, None], mask=tm[:, None])
    tl.store(row + N + j[None, :], dm_post * rstd[:, None], mask=tm[:, None])
    tl.store(DZ + t[:, None, None] * M + r_off, dm_res * rstd[:, None, None],
             mask=tm[:, None, None])
    sdm = tl.sum(dm_pre * m_pre, axis=1) + tl.sum(dm_post * m_post, axis=1) \
        + tl.sum(tl.sum(dm_res * m_res, axis=2), axis=1)
    tl.store(CX + t, -sdm * rstd * rstd / (N * C), mask=tm)


@triton.jit(do_not_specialize=["n_tok"])
def mhc_bwd_dx_kernel(
    X, DU, DX_IN, COEF, DZ, CX, PHI, DX, PART,
    n_tok, C, n_slices, stride_xt, stride_xi, stride_dut, stride_dit, stride_dii,
    stride_dxt, stride_dxi,
    N: tl.constexpr, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr, PREC: tl.constexpr, HAS_DX_IN: tl.constexpr,
):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    i = pid % N
    c = (pid // N) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    k = (i * C + c).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    mm = m < M
    phi = tl.load(PHI + k[:, None] * M + m[None, :], mask=cm[:, None] & mm[None, :], other=0.0)
    phi_t = tl.trans(phi)
    acc = tl.zeros([BLOCK_C, BLOCK_M], dtype=tl.float32)
    n_blocks = tl.cdiv(n_tok, BLOCK_T)
    for blk in range(s, n_blocks, n_slices):
        t = (blk * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        tm = t < n_tok
        msk = tm[:, None] & cm[None, :]
        dz = tl.load(DZ + t[:, None] * M + m[None, :], mask=tm[:, None] & mm[None, :],
                     other=0.0)
        cx = tl.load(CX + t, mask=tm, other=0.0)
        hp = tl.load(COEF + t * M + i, mask=tm, other=0.0)
        du = tl.load(DU + t[:, None] * stride_dut + c[None, :], mask=msk, other=0.0)
        x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :], mask=msk,
                    other=0.0).to(tl.float32)
        dx = hp[:, None] * du.to(tl.float32) + cx[:, None] * x
        dx = mma(dz, phi_t, dx, PREC)
        if HAS_DX_IN:
            dx += tl.load(DX_IN + t[:, None] * stride_dit + i * stride_dii + c[None, :],
                          mask=msk, other=0.0).to(tl.float32)
        tl.store(DX + t[:, None] * stride_dxt + i * stride_dxi + c[None, :],
                 dx.to(DX.dtype.element_ty), mask=msk)
        acc = mma(tl.trans(x), dz, acc, PREC)
    tl.store(PART + s.to(tl.int64) * N * C * M + k[:, None] * M + m[None, :], acc,
             mask=cm[:, None] & mm[None, :])


@triton.jit(do_not_specialize=["n_rows"])
def rows_sum_kernel(P, OUT, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    pid = tl.program_id(0)
    w = (pid * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
    wm = w < n_cols
    acc = tl.zeros([BLOCK_W], dtype=tl.float32)
    for r0 in range(0, n_rows, BLOCK_R):
        r = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        tile = tl.load(P + r[:, None] * n_cols + w[None, :],
                       mask=(r < n_rows)[:, None] & wm[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(OUT + w, acc, mask=wm)
