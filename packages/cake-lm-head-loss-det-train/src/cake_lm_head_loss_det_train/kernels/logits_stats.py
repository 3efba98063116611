"""A chunk's logits with per-tile row statistics in the GEMM's epilogue (plan ``logits_stats``).

One program per ``[BLOCK_M, BLOCK_N]`` output tile of ``logits = h_c @ W^T (+ b)`` (the main
loop of cake_core.gemm: :func:`~cake_core.gemm.tma_tile_acc` with TMA descriptors, else
:func:`~cake_core.gemm.ptr_tile_acc`). The epilogue writes the fp32 tile to ``LOGITS`` and,
with s the (soft-capped) logits of the tile's valid columns, the row statistics

    STATS[row, 0, j] = m = max_col s          STATS[row, 1, j] = sum_col exp(s - m)

for column tile ``j`` (fp32 ``[rows, 2, n_tiles_n]``). The cross-entropy kernel then takes
each row's logsumexp from its tiles' statistics in tile order (kernels/ce.py, ``STATS``)
and reads the fp32 logits once, for the gradient, instead of twice (QuACK's linear cross
entropy computes the softmax statistics in the GEMM's epilogue the same way). No atomics:
each program writes only its own tile and its own statistics.
"""

import triton
import triton.language as tl
from cake_core.gemm import ptr_tile_acc, tma_tile_acc
from cake_core.triton_utils import tanh


@triton.jit
def logits_stats_kernel(
    A, B, A_DESC, B_DESC, BIAS, LOGITS, L_DESC, STATS,
    M, N, K, n_tiles_m, n_tiles_n,
    stride_am, stride_ak, stride_bk, stride_bn, stride_lm, softcap,
    TMA: tl.constexpr, EPI: tl.constexpr, B_T: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr,
    PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """``LOGITS = A @ B (+ BIAS)`` (``[M, N]`` fp32, row stride ``stride_lm``) and each row's
    max and sum of exponentials per column tile into ``STATS`` (``[M, 2, n_tiles_n]``
    fp32). ``TMA``: A (``[M, K]``) and B (``[K, N]``, described as its row-major source
    ``B^T`` when ``B_T``) read through the descriptors; else through the pointers and
    strides, and LOGITS written through ``L_DESC``."""
    tile = tl.program_id(0)
    if TMA:
        acc, off_m, off_n = tma_tile_acc(A_DESC, B_DESC, tile, 0, K, K, n_tiles_m, n_tiles_n,
                                         False, B_T, PREC, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        rm = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
        rn = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
    else:
        acc, rm, rn = ptr_tile_acc(A, B, tile, 0, M, N, K, K, n_tiles_m, n_tiles_n,
                                   stride_am, stride_ak, stride_bk, stride_bn, PREC,
                                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    mm = rm < M
    nm = rn < N
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
    if EPI == 1:  # a TMA store (clipped at the edges): it drains while the next tile computes
        L_DESC.store([off_m, off_n], acc)
    elif EPI == 2:  # two TMA stores of half tiles (less shared memory)
        a0, a1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        L_DESC.store([off_m, off_n], a0)
        L_DESC.store([off_m, off_n + BLOCK_N // 2], a1)
    else:
        tl.store(LOGITS + rm[:, None] * stride_lm + rn[None, :], acc,
                 mask=mm[:, None] & nm[None, :])
    z = acc
    if SOFTCAP:
        z = softcap * tanh(z / softcap)
    z = tl.where(nm[None, :], z, float("-inf"))
    m = tl.max(z, axis=1)
    se = tl.sum(tl.exp(z - m[:, None]), axis=1)
    j = rn // BLOCK_N  # every column of the tile: its tile index (one value)
    st = STATS + rm * (2 * n_tiles_n) + tl.max(j, axis=0)
    tl.store(st, m, mask=mm)
    tl.store(st + n_tiles_n, se, mask=mm)
