"""mhc_det_finish: Y[t, j] = H_post[t, j] * B[t] + sum_i H_res[t, j, i] * X[t, i], and its
backward.

``mhc_finish_fwd_kernel``: one program per (BLOCK_T tokens, BLOCK_C channels), all n output
streams at once (a ``[BLOCK_T, n, BLOCK_C]`` tile, fp32).

``mhc_finish_bwd_kernel``: one program per BLOCK_T tokens walks the channels in steps of
BLOCK_C and writes, per step, dX[t, i] = sum_j H_res[t, j, i] dY[t, j] and
dB[t] = sum_j H_post[t, j] dY[t, j]; it accumulates over the channels (fp32, fixed order)
dH_post[t, j] = sum_c dY[t, j, c] B[t, c] and dH_res[t, j, i] = sum_c dY[t, j, c] X[t, i, c]
and writes DCOEF[t] = [0 (n), dH_post (n), dH_res (n*n)] (COEF's layout). No cross-token
sums here: nothing to order.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_tok"])
def mhc_finish_fwd_kernel(
    X, B, COEF, Y,
    n_tok, C, stride_xt, stride_xi, stride_bt, stride_yt, stride_yi,
    N: tl.constexpr, M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    t = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    msk = tm[:, None] & cm[None, :]
    j = tl.arange(0, N)
    h_post = tl.load(COEF + t[:, None] * M + N + j[None, :], mask=tm[:, None], other=0.0)
    b = tl.load(B + t[:, None] * stride_bt + c[None, :], mask=msk, other=0.0).to(tl.float32)
    y = h_post[:, :, None] * b[:, None, :]
    for i in tl.static_range(N):
        x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :], mask=msk,
                    other=0.0).to(tl.float32)
        h_col = tl.load(COEF + t[:, None] * M + 2 * N + j[None, :] * N + i, mask=tm[:, None],
                        other=0.0)
        y += h_col[:, :, None] * x[:, None, :]
    tl.store(Y + t[:, None, None] * stride_yt + j[None, :, None] * stride_yi
             + c[None, None, :], y.to(Y.dtype.element_ty), mask=msk[:, None, :])


@triton.jit(do_not_specialize=["n_tok"])
def mhc_finish_bwd_kernel(
    DY, X, B, COEF, DX, DB, DCOEF,
    n_tok, C, stride_dyt, stride_dyi, stride_xt, stride_xi, stride_bt, stride_dxt,
    stride_dxi, stride_dbt,
    N: tl.constexpr, M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tm = t < n_tok
    j = tl.arange(0, N)
    jj = tl.arange(0, N)[None, :, None]
    ii = tl.arange(0, N)[None, None, :]
    h_post = tl.load(COEF + t[:, None] * M + N + j[None, :], mask=tm[:, None], other=0.0)
    d_post = tl.zeros([BLOCK_T, N], dtype=tl.float32)
    d_res = tl.zeros([BLOCK_T, N, N], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        msk = tm[:, None] & (c < C)[None, :]
        dy = tl.load(DY + t[:, None, None] * stride_dyt + j[None, :, None] * stride_dyi
                     + c[None, None, :], mask=msk[:, None, :], other=0.0).to(tl.float32)
        b = tl.load(B + t[:, None] * stride_bt + c[None, :], mask=msk, other=0.0)
        b = b.to(tl.float32)
        d_post += tl.sum(dy * b[:, None, :], axis=2)
        db = tl.sum(h_post[:, :, None] * dy, axis=1)
        tl.store(DB + t[:, None] * stride_dbt + c[None, :], db.to(DB.dtype.element_ty),
                 mask=msk)
        for i in tl.static_range(N):
            x = tl.load(X + t[:, None] * stride_xt + i * stride_xi + c[None, :], mask=msk,
                        other=0.0).to(tl.float32)
            d_res += tl.where(ii == i, tl.sum(dy * x[:, None, :], axis=2)[:, :, None], 0.0)
            h_col = tl.load(COEF + t[:, None] * M + 2 * N + j[None, :] * N + i,
                            mask=tm[:, None], other=0.0)
            dx = tl.sum(h_col[:, :, None] * dy, axis=1)
            tl.store(DX + t[:, None] * stride_dxt + i * stride_dxi + c[None, :],
                     dx.to(DX.dtype.element_ty), mask=msk)
    row = DCOEF + t[:, None] * M
    tl.store(row + j[None, :], tl.zeros([BLOCK_T, N], dtype=tl.float32), mask=tm[:, None])
    tl.store(row + N + j[None, :], d_post, mask=tm[:, None])
    tl.store(DCOEF + t[:, None, None] * M + 2 * N + jj * N + ii, d_res,
             mask=tm[:, None, None])
