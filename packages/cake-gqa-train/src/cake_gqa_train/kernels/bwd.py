"""The non-deterministic dK / dV kernel: one program per (key block, query head, document)
sums its head's share of dK and dV over query blocks and, when several query heads share a
KV head (GQA), adds it into fp32 buffers with atomic adds, whose order changes from run to
run (8x the programs of the det kernel at Hq / Hkv = 8: better balanced under a causal
mask). dQ is cake-gqa-det-train's kernel."""

from cake_core.triton_utils import dot, select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cake_gqa_det_train.kernels.bwd import lse2_row  # noqa: E402
from cake_gqa_det_train.kernels.common import (  # noqa: E402
    block_full,
    doc_bounds,
    scores2,
    visible,
)


@triton.jit
def gqa_bwd_dkdv_atomic_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, sqh, skt, skh, svt, svh, sdot, sdoh, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One query head's share of dK, dV of one key block: stored in K's / V's dtype when
    GROUP = 1, else added (fp32, dK unscaled) into DK / DV ``[Tk, Hkv, D]`` contiguous."""
    pid_n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)  # h * stride in int64: head-major packed input
    hk = h // GROUP
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    n_start = pid_n * BLOCK_N
    if n_start >= len_k:
        return
    shift = len_k - len_q
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_m0 = tl.arange(0, BLOCK_M)
    col_ok = offs_n < len_k
    k = tl.load(K + (k0 + offs_n)[:, None].to(tl.int64) * skt + hk * skh + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    v = tl.load(V + (k0 + offs_n)[:, None].to(tl.int64) * svt + hk * svh + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    lo = 0
    if HAS_RIGHT:
        lo = tl.maximum(0, n_start - shift - right)
        lo = (lo // BLOCK_M) * BLOCK_M
    hi = len_q
    if HAS_LEFT:
        hi = tl.minimum(hi, n_start + BLOCK_N - shift + left)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for m_start in range(lo, hi, BLOCK_M):
        offs_m = m_start + offs_m0
        row_ok = offs_m < len_q
        rows = (q0 + offs_m).to(tl.int64)
        qt = tl.load(Q + rows[None, :] * sqt + h * sqh + offs_d[:, None],
                     mask=row_ok[None, :], other=0.0)
        do = tl.load(DO + rows[:, None] * sdot + h * sdoh + offs_d[None, :],
                     mask=row_ok[:, None], other=0.0)
        lse2 = lse2_row(LSE, h.to(tl.int64) * n_tok_q + rows, row_ok)
        delta = tl.load(DELTA + h.to(tl.int64) * n_tok_q + rows, mask=row_ok, other=0.0)
        qkt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        qkt = dot(k, qt, qkt)
        st, tt = scores2(qkt, scale, softcap, SOFTCAP)
        pt = tl.exp2(st - lse2[None, :])
        if not block_full(m_start, n_start, len_q, len_k, shift, left, right, BLOCK_M,
                          BLOCK_N, HAS_LEFT, HAS_RIGHT):
            ok = tl.trans(visible(offs_m, offs_n, len_q, len_k, shift, left, right,
                                  HAS_LEFT, HAS_RIGHT))
            pt = tl.where(ok, pt, 0.0)
        dv = dot(pt.to(do.dtype), do, dv)
        dpt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        dpt = dot(v, tl.trans(do), dpt)
        dst = pt * (dpt - delta[None, :])
        if SOFTCAP:
            dst = dst * (1.0 - tt * tt)
        dk = dot(dst.to(qt.dtype), tl.trans(qt), dk)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    if GROUP == 1:
        tl.store(DK + rows_k * sdkt + hk * sdkh + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
        tl.store(DV + rows_k * sdvt + hk * sdvh + offs_d[None, :],
                 dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
    else:
        tl.atomic_add(DK + rows_k * sdkt + hk * sdkh + offs_d[None, :], dk,
                      mask=col_ok[:, None], sem="relaxed")
        tl.atomic_add(DV + rows_k * sdvt + hk * sdvh + offs_d[None, :], dv,
                      mask=col_ok[:, None], sem="relaxed")
