"""q/k L2 norm: y = x * rsqrt(sum(x**2) + eps) per row of K, fp32 out, rstd saved.

One program per ``BLOCK_R`` rows (rows = tokens x heads); rows are independent, no atomics.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows"])
def gdn_l2norm_fwd_kernel(
    X, Y, RSTD, n_rows, KD, eps,
    BLOCK_R: tl.constexpr, BK: tl.constexpr,
):
    pid = tl.program_id(0)
    r = (pid * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    ck = tl.arange(0, BK)
    rmask = r < n_rows
    mask = rmask[:, None] & (ck < KD)[None, :]
    x = tl.load(X + r[:, None] * KD + ck[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) + eps)
    tl.store(Y + r[:, None] * KD + ck[None, :], x * rstd[:, None], mask=mask)
    tl.store(RSTD + r, rstd, mask=rmask)
