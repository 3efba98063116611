"""Forward of mhc_det_prepare: the projection (RMS and x·phi), then coefficients and U.

``mhc_mix_kernel``: one program per BLOCK_T tokens walks the n·C row in steps of BLOCK_C
channels of one stream (stream 0's blocks first, then stream 1's, ...), accumulating the sum of squares and x·phi (fp32) in registers:
MIX[t] = rstd[t] * (x[t] @ phi), RSTD[t] = 1 / sqrt(mean(x[t]^2) + eps).

``mhc_coef_kernel``: one program per BLOCK_T tokens builds the logits from MIX, alpha and
bias, H_pre = sigmoid, H_post = 2 sigmoid, H_res = Sinkhorn (log domain, common.py), writes
COEF[t] = [H_pre (n), H_post (n), H_res (n*n, row j = output stream, column i = input)] and
U[t] = sum_i H_pre[i] X[t, i] (cast to U's dtype).
"""

import triton
import triton.language as tl

from cake_mhc_det_train.kernels.common import column, load_logits, mma, sinkhorn_fwd


@triton.jit(do_not_specialize=["n_tok"])
def mhc_mix_kernel(
    X, PHI, MIX, RSTD,
    n_tok, C, stride_xt, stride_xi, eps,
    N: tl.constexpr, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    m = tl.arange(0, BLOCK_M)
    mm = m < M
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    n_cb = tl.cdiv(C, BLOCK_C)
    # one loop over (stream, channel block) pairs, streams outer: a single pipelined loop
    # (unrolling the streams would give each copy its own shared-memory stages)
    for kb in range(0, N * n_cb):
        i = kb // n_cb
        c = (kb - i * n_cb) * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :],
                    mask=tm[:, None] & cm[None, :], other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
        k = (i * C + c).to(tl.int64)
        p = tl.load(PHI + k[:, None] * M + m[None, :], mask=cm[:, None] & mm[None, :],
                    other=0.0)
        acc = mma(x, p, acc, PREC)
    rstd = 1.0 / tl.sqrt(ss / (N * C) + eps)
    tl.store(MIX + t[:, None] * M + m[None, :], acc * rstd[:, None],
             mask=tm[:, None] & mm[None, :])
    tl.store(RSTD + t, rstd, mask=tm)


@triton.jit(do_not_specialize=["n_tok"])
def mhc_coef_kernel(
    X, MIX, ALPHA, BIAS, COEF, U,
    n_tok, C, stride_xt, stride_xi, stride_ut,
    N: tl.constexpr, M: tl.constexpr, ITERS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    j = tl.arange(0, N)
    jj = tl.arange(0, N)[None, :, None]
    ii = tl.arange(0, N)[None, None, :]
    _, _, _, h_pre, h_post, h_res = load_logits(MIX, ALPHA, BIAS, t, tm, N, M)
    H_pre = tl.sigmoid(h_pre)
    H_post = 2.0 * tl.sigmoid(h_post)
    H_res = sinkhorn_fwd(h_res, ITERS, BLOCK_T, N)
    row = COEF + t[:, None] * M
    tl.store(row + j[None, :], H_pre, mask=tm[:, None])
    tl.store(row + N + j[None, :], H_post, mask=tm[:, None])
    tl.store(COEF + t[:, None, None] * M + 2 * N + jj * N + ii, H_res, mask=tm[:, None, None])
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        msk = tm[:, None] & (c < C)[None, :]
        u = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for i in tl.static_range(N):
            x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :], mask=msk,
                        other=0.0).to(tl.float32)
            u += column(H_pre, j, i)[:, None] * x
        tl.store(U + t[:, None] * stride_ut + c[None, :], u.to(U.dtype.element_ty), mask=msk)
