"""The non-deterministic dK / dV kernel: one program per (key block, query head, document)
sums its head's share of dK and dV over query blocks and, when several query heads share a
KV head (GQA), adds it into fp32 buffers with atomic adds, whose order changes from run to
run (8x the programs of the det kernel at Hq / Hkv = 8: better balanced under a causal
mask). Its scores are K Q^T (the transposed form: P^T and dS^T come out of the products as
the dV and dK products take them), which the atomic programs run faster at head dim 256
than the det kernel's Q K^T. dQ is cake-gqa-det-train's kernel."""

from cake_core.triton_utils import select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cake_core.triton_utils import dot  # noqa: E402
from cake_gqa_det_train.kernels.bwd import key_block, lse2_row, query_range  # noqa: E402
from cake_gqa_det_train.kernels.common import (  # noqa: E402
    doc_bounds,
    doc_desc,
    full_q_blocks,
    scores2,
    visible,
)


@triton.jit
def dkdv_step_t(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n, len_q,
                len_k, shift, n_tok_q, scale, softcap, left, right, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, HAS_LEFT: tl.constexpr,
                HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """``(dk, dv)`` plus the query block at ``m_start`` of head ``h``, the scores
    transposed ``[BLOCK_N, BLOCK_M]`` (K Q^T). MASK: apply the mask (else all-true)."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < len_q
    h64 = h.to(tl.int64)  # h * n_tok_q in int64
    rows = (q0 + offs_m).to(tl.int64)
    q = q_desc.load([m_start, h * D])
    do = do_desc.load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    qkt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    qkt = dot(k, tl.trans(q), qkt)
    st, tt = scores2(qkt, scale, softcap, SOFTCAP)
    pt = tl.exp2(st - lse2[None, :])
    if MASK:
        ok = tl.trans(visible(offs_m, offs_n, len_q, len_k, shift, left, right, HAS_LEFT,
                              HAS_RIGHT))
        pt = tl.where(ok, pt, 0.0)
    dv = dot(pt.to(do.dtype), do, dv)
    dpt = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    dpt = dot(v, tl.trans(do), dpt)
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - tt * tt)
    return dot(dst.to(q.dtype), q, dk), dv


@triton.jit
def gqa_bwd_dkdv_atomic_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One query head's share of dK, dV of one key block: stored in K's / V's dtype when
    GROUP = 1, else added (fp32, dK unscaled) into DK / DV ``[Tk, Hkv, D]`` contiguous."""
    pid_n = tl.program_id(0)
    h = tl.program_id(1)
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
    col_ok = offs_n < len_k
    k, v = key_block(K, V, k0, len_k, skt, svt, n_start, hk, Hkv, BLOCK_N, D)
    q_desc = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D)
    do_desc = doc_desc(DO, q0, len_q, sdot, Hq * D, BLOCK_M, D)
    lo, hi = query_range(n_start, len_q, shift, left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                         HAS_RIGHT)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    a, b = full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    for m_start in range(lo, a, BLOCK_M):
        dk, dv = dkdv_step_t(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                             offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                             right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    for m_start in range(a, b, BLOCK_M):
        dk, dv = dkdv_step_t(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                             offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                             right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, False)
    for m_start in range(b, hi, BLOCK_M):
        dk, dv = dkdv_step_t(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start,
                             offs_n, len_q, len_k, shift, n_tok_q, scale, softcap, left,
                             right, BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    hk = hk.to(tl.int64)  # hk * stride in int64
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
