"""Backward kernels, with no atomics: every gradient element is summed by one program in a
fixed order (FlashAttention-2's backward split in two passes, as its deterministic mode).
Q, K, V and dO tiles come in through per-document TMA descriptors.

* :func:`gqa_bwd_delta_kernel`: delta = rowsum(dO * O) per query row and head (fp32).
* :func:`gqa_bwd_dkdv_kernel`: one program per (key block, KV head, document) sums dK and
  dV over the KV head's query heads (in head order) and, per head, over the query blocks
  that see the key block (in block order); the scores as Q K^T, so that K and V stay in
  shared memory.
* :func:`gqa_bwd_dq_kernel`: one program per (query block, query head, document) sums dQ
  over the key blocks the rows see, in block order.

Both loops run the blocks whose mask is all-true in a loop of their own, with no mask
code, between the masked blocks before and after them: the same blocks in the same order.
"""

from cake_core.triton_utils import dot, select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from cake_gqa_det_train.kernels.common import (  # noqa: E402
    LOG2E,
    doc_bounds,
    doc_desc,
    full_k_blocks,
    full_q_blocks,
    scores2,
    visible,
)


@triton.jit
def gqa_bwd_delta_kernel(O, DO, DELTA, n_tok, sot, soh, sdot, sdoh,
                         D: tl.constexpr, BLOCK_M: tl.constexpr):
    """DELTA ``[Hq, T]`` fp32 = sum over d of dO * O, for one block of rows of one head."""
    pid = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)  # h * stride in int64: head-major packed input
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    ok = offs_m < n_tok
    o = tl.load(O + offs_m[:, None].to(tl.int64) * sot + h * soh + offs_d[None, :],
                mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + offs_m[:, None].to(tl.int64) * sdot + h * sdoh + offs_d[None, :],
                 mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + h.to(tl.int64) * n_tok + offs_m, tl.sum(o * do, 1), mask=ok)


@triton.jit
def lse2_row(LSE, row_ptr_off, ok):
    """The rows' LSE in the log2 domain; a row that sees no key (-inf) reads 0, so that its
    masked scores (-inf) give P = 0, not NaN."""
    lse = tl.load(LSE + row_ptr_off, mask=ok, other=0.0)
    return tl.where(lse == float("-inf"), 0.0, lse * LOG2E)


@triton.jit
def key_block(K, V, k0, len_k, skt, svt, n_start, hk, Hkv, BLOCK_N: tl.constexpr,
              D: tl.constexpr):
    """The K and V tiles ``[BLOCK_N, D]`` of the key block at ``n_start`` of KV head ``hk``
    (rows past the document's end are zeros)."""
    k = doc_desc(K, k0, len_k, skt, Hkv * D, BLOCK_N, D).load([n_start, hk * D])
    v = doc_desc(V, k0, len_k, svt, Hkv * D, BLOCK_N, D).load([n_start, hk * D])
    return k, v


@triton.jit
def query_range(n_start, len_q, shift, left, right, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[lo, hi): the query rows that see a key of the block starting at ``n_start`` (lo
    aligned down to BLOCK_M)."""
    lo = 0
    if HAS_RIGHT:
        lo = tl.maximum(0, n_start - shift - right)
        lo = (lo // BLOCK_M) * BLOCK_M
    hi = len_q
    if HAS_LEFT:
        hi = tl.minimum(hi, n_start + BLOCK_N - shift + left)
    return lo, hi


@triton.jit
def dkdv_step(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n, len_q,
              len_k, shift, n_tok_q, scale, softcap, left, right, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, D: tl.constexpr, HAS_LEFT: tl.constexpr,
              HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """``(dk, dv)`` plus the query block at ``m_start`` of head ``h``: scores as Q K^T (K
    and V are the products' second operands, so they stay in shared memory), P and dS
    transposed into the dV and dK products. MASK: apply the mask (else it is all-true)."""
    offs_m = m_start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < len_q
    h64 = h.to(tl.int64)  # h * n_tok_q in int64
    rows = (q0 + offs_m).to(tl.int64)
    q = q_desc.load([m_start, h * D])
    do = do_desc.load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    qk = dot(q, tl.trans(k), qk)
    s, t = scores2(qk, scale, softcap, SOFTCAP)
    p = tl.exp2(s - lse2[:, None])
    if MASK:
        ok = visible(offs_m, offs_n, len_q, len_k, shift, left, right, HAS_LEFT, HAS_RIGHT)
        p = tl.where(ok, p, 0.0)
    dv = dot(tl.trans(p.to(do.dtype)), do, dv)
    dp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    dp = dot(do, tl.trans(v), dp)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    dk = dot(tl.trans(ds.to(q.dtype)), q, dk)
    return dk, dv


@triton.jit
def dkdv_one_head(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, lo, hi, n_start, offs_n,
                  len_q, len_k, shift, n_tok_q, scale, softcap, left, right,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr):
    """``(dk, dv)`` plus query head ``h``'s share of one key block's dK (unscaled) and dV:
    the query blocks of [lo, hi) in order, Q and dO tiles from the document's descriptors.
    The blocks whose mask is all-true run in a loop with no mask code, between the masked
    ones before and after them (the same order, so the same sums). Rows past the
    document's end load zeros and add nothing."""
    a, b = full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    for m_start in range(lo, a, BLOCK_M):
        dk, dv = dkdv_step(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n,
                           len_q, len_k, shift, n_tok_q, scale, softcap, left, right,
                           BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    for m_start in range(a, b, BLOCK_M):
        dk, dv = dkdv_step(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n,
                           len_q, len_k, shift, n_tok_q, scale, softcap, left, right,
                           BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, False)
    for m_start in range(b, hi, BLOCK_M):
        dk, dv = dkdv_step(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, h, q0, m_start, offs_n,
                           len_q, len_k, shift, n_tok_q, scale, softcap, left, right,
                           BLOCK_M, BLOCK_N, D, HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    return dk, dv


@triton.jit
def gqa_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdkt, sdkh, sdvt, sdvh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """dK, dV of one key block of one KV head: sum over its GROUP query heads (head order),
    then over query blocks (block order). Written in K's / V's dtype."""
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
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
    for g in range(GROUP):
        dk, dv = dkdv_one_head(dk, dv, k, v, q_desc, do_desc, LSE, DELTA, hk * GROUP + g, q0,
                               lo, hi, n_start, offs_n, len_q, len_k, shift, n_tok_q, scale,
                               softcap, left, right, BLOCK_M, BLOCK_N, D, HAS_LEFT,
                               HAS_RIGHT, SOFTCAP)
    rows_k = (k0 + offs_n)[:, None].to(tl.int64)
    hk64 = hk.to(tl.int64)  # hk * stride in int64
    tl.store(DK + rows_k * sdkt + hk64 * sdkh + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + rows_k * sdvt + hk64 * sdvh + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0, len_q,
            len_k, shift, scale, softcap, left, right, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
            HAS_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASK: tl.constexpr):
    """``dq`` (unscaled) plus the key block at ``n_start``. MASK: apply the mask (else it is
    all-true)."""
    k = k_desc.load([n_start, hk * D])
    v = v_desc.load([n_start, hk * D])
    qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    qk = dot(q, tl.trans(k), qk)
    s, t = scores2(qk, scale, softcap, SOFTCAP)
    p = tl.exp2(s - lse2[:, None])
    if MASK:
        ok = visible(offs_m, n_start + offs_n0, len_q, len_k, shift, left, right, HAS_LEFT,
                     HAS_RIGHT)
        p = tl.where(ok, p, 0.0)
    dp = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    dp = dot(do, tl.trans(v), dp)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return dot(ds.to(k.dtype), k, dq)


@triton.jit
def gqa_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sdot, Hq, Hkv, sdqt, sdqh,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """dQ of one query block of one query head: sum over the key blocks its rows see, in
    block order. Written in Q's dtype."""
    # the last query blocks first: under a causal mask they have the most keys
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    doc = tl.program_id(2)
    q0, len_q = doc_bounds(CU_Q, doc, seq_q, VARLEN)
    k0, len_k = doc_bounds(CU_K, doc, seq_k, VARLEN)
    m_start = pid_m * BLOCK_M
    if m_start >= len_q:
        return
    hk = h // GROUP
    shift = len_k - len_q
    k_desc = doc_desc(K, k0, len_k, skt, Hkv * D, BLOCK_N, D)
    v_desc = doc_desc(V, k0, len_k, svt, Hkv * D, BLOCK_N, D)
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n0 = tl.arange(0, BLOCK_N)
    row_ok = offs_m < len_q
    rows = (q0 + offs_m).to(tl.int64)
    h64 = h.to(tl.int64)  # h * stride in int64
    q = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D).load([m_start, h * D])
    do = doc_desc(DO, q0, len_q, sdot, Hq * D, BLOCK_M, D).load([m_start, h * D])
    lse2 = lse2_row(LSE, h64 * n_tok_q + rows, row_ok)
    delta = tl.load(DELTA + h64 * n_tok_q + rows, mask=row_ok, other=0.0)
    hi = len_k
    if HAS_RIGHT:
        hi = tl.minimum(hi, m_start + BLOCK_M + shift + right)
    lo = 0
    if HAS_LEFT:
        lo = tl.maximum(0, m_start + shift - left)
        lo = (lo // BLOCK_N) * BLOCK_N
    a, b = full_k_blocks(m_start, lo, hi, len_k, shift, left, right, BLOCK_M, BLOCK_N,
                         HAS_LEFT, HAS_RIGHT)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(lo, a, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    for n_start in range(a, b, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, False)
    for n_start in range(b, hi, BLOCK_N):
        dq = dq_step(dq, q, do, lse2, delta, k_desc, v_desc, hk, n_start, offs_m, offs_n0,
                     len_q, len_k, shift, scale, softcap, left, right, D, BLOCK_M, BLOCK_N,
                     HAS_LEFT, HAS_RIGHT, SOFTCAP, True)
    tl.store(DQ + rows[:, None] * sdqt + h64 * sdqh + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
