"""Forward kernel: one program per (query block, query head, document), online softmax over
the key blocks the block's rows can see (FlashAttention-2, Dao 2023), in the log2 domain.
Q, K and V tiles come in through per-document TMA descriptors."""

from cake_core.triton_utils import dot, select_backend

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from cake_gqa_det_train.kernels.common import (  # noqa: E402
    LOG2E,
    block_full,
    doc_bounds,
    doc_desc,
    scores2,
    visible,
)


@triton.jit
def gqa_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,
    seq_q, seq_k, n_tok_q, scale, softcap, left, right,
    sqt, skt, svt, sot, soh, Hq, Hkv,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """O ``[Tq, Hq, D]`` and LSE ``[Hq, Tq]`` (fp32, natural log) of one query block.

    Rows with no visible key get O = 0 and LSE = -inf. ``seq_q`` / ``seq_k``: the fixed
    lengths (unused when VARLEN). ``left`` / ``right``: the window (used when HAS_*).
    Q, K, V: heads contiguous in a token (``[T, H * D]``, row strides ``sqt`` ...)."""
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
    q = doc_desc(Q, q0, len_q, sqt, Hq * D, BLOCK_M, D).load([m_start, h * D])
    # the key blocks the rows can see
    hi = len_k
    if HAS_RIGHT:
        hi = tl.minimum(hi, m_start + BLOCK_M + shift + right)
    lo = 0
    if HAS_LEFT:
        lo = tl.maximum(0, m_start + shift - left)
        lo = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(lo, hi, BLOCK_N):
        offs_n = n_start + offs_n0
        k = k_desc.load([n_start, hk * D])
        qk = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        qk = dot(q, tl.trans(k), qk)
        s, _ = scores2(qk, scale, softcap, SOFTCAP)
        if not block_full(m_start, n_start, len_q, len_k, shift, left, right, BLOCK_M,
                          BLOCK_N, HAS_LEFT, HAS_RIGHT):
            ok = visible(offs_m, offs_n, len_q, len_k, shift, left, right, HAS_LEFT,
                         HAS_RIGHT)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([n_start, hk * D])
        acc = acc * alpha[:, None]
        acc = dot(p.to(v.dtype), v, acc)
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) / LOG2E)
    h64 = h.to(tl.int64)  # h * stride in int64
    tl.store(O + (q0 + offs_m)[:, None].to(tl.int64) * sot + h64 * soh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + h64 * n_tok_q + q0 + offs_m, lse, mask=row_ok)
