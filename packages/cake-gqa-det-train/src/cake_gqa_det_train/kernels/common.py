"""Jitted helpers the forward and backward kernels share: a document's bounds and its TMA
descriptors, the mask, the (optionally soft-capped) scores in the log2 domain."""

from cake_core.triton_utils import select_backend, tanh

select_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def doc_bounds(cu_ptr, doc, fixed_len, VARLEN: tl.constexpr):
    """(start token, length) of document ``doc``: from ``cu_ptr`` when VARLEN, else the
    fixed-length batch row ``doc`` of ``fixed_len`` tokens."""
    if VARLEN:
        start = tl.load(cu_ptr + doc).to(tl.int32)
        end = tl.load(cu_ptr + doc + 1).to(tl.int32)
        return start, end - start
    else:
        return doc * fixed_len, fixed_len + 0 * doc


@triton.jit
def doc_desc(X, start, length, row_stride, n_cols, BLOCK: tl.constexpr, D: tl.constexpr):
    """A TMA descriptor of one document's rows of ``X`` seen as ``[T, H * D]`` (``n_cols``
    = H * D, columns contiguous): ``BLOCK`` x ``D`` tiles at (row in the document, head *
    D); rows past the document's end read zeros. A document of no rows gets a one-row
    descriptor that nothing loads from."""
    return tl.make_tensor_descriptor(X + start.to(tl.int64) * row_stride,
                                     shape=[tl.maximum(length, 1), n_cols],
                                     strides=[row_stride, 1], block_shape=[BLOCK, D])


@triton.jit
def visible(offs_m, offs_n, len_q, len_k, shift, left, right,
            HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[BM, BN] mask of the key columns row m sees: in range, and within the window around
    the bottom-right-aligned diagonal ``n = m + shift`` (``shift = len_k - len_q``)."""
    ok = (offs_m[:, None] < len_q) & (offs_n[None, :] < len_k)
    if HAS_RIGHT:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + shift + right)
    if HAS_LEFT:
        ok = ok & (offs_n[None, :] >= offs_m[:, None] + shift - left)
    return ok


@triton.jit
def scores2(qk, scale, softcap, SOFTCAP: tl.constexpr):
    """(scores in the log2 domain, tanh term): ``scale * qk`` or ``softcap * tanh(scale *
    qk / softcap)``, times log2(e); the tanh term is 0 without a soft cap."""
    if SOFTCAP:
        t = tanh(qk * (scale / softcap))
        return t * (softcap * LOG2E), t
    else:
        return qk * (scale * LOG2E), qk * 0.0


@triton.jit
def block_full(m_start, n_start, len_q, len_k, shift, left, right,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """True when every key column of the block is in range and every in-range row of the
    block sees all of them: the mask is all-true there and is skipped. Rows past the
    document's end need no mask (their loads are zeros and nothing of them is stored)."""
    full = n_start + BLOCK_N <= len_k
    if HAS_RIGHT:  # the first row sees up to m_start + shift + right
        full = full & (n_start + BLOCK_N - 1 <= m_start + shift + right)
    if HAS_LEFT:  # the last row sees down to m_start + BLOCK_M - 1 + shift - left
        full = full & (n_start >= m_start + BLOCK_M - 1 + shift - left)
    return full


@triton.jit
def full_q_blocks(n_start, lo, hi, len_k, shift, left, right, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[a, b), lo <= a <= b <= hi: the query blocks of [lo, hi) (lo on the BLOCK_M grid)
    whose mask against the key block at ``n_start`` is all-true (:func:`block_full`'s
    conditions solved for the block's first row); those before a and from b on need it.
    An empty range (hi <= lo, a window that sees none of the rows) gives a = b = lo."""
    hi = tl.maximum(hi, lo)
    a = lo
    b = hi
    if HAS_RIGHT:  # n_start + BLOCK_N - 1 <= m_start + shift + right
        x = tl.maximum(n_start + BLOCK_N - 1 - shift - right, lo)
        a = tl.minimum((x + BLOCK_M - 1) // BLOCK_M * BLOCK_M, hi)
    if HAS_LEFT:  # n_start >= m_start + BLOCK_M - 1 + shift - left
        y = n_start - BLOCK_M + 1 - shift + left
        b = tl.where(y < lo, lo, tl.minimum(y // BLOCK_M * BLOCK_M + BLOCK_M, hi))
    partial = n_start + BLOCK_N > len_k  # the document's last key block: masked throughout
    a = tl.where(partial, hi, a)
    b = tl.where(partial, hi, tl.maximum(b, a))
    return a, b


@triton.jit
def full_k_blocks(m_start, lo, hi, len_k, shift, left, right, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[a, b), lo <= a <= b <= hi: the key blocks of [lo, hi) (lo on the BLOCK_N grid)
    whose mask against the query block at ``m_start`` is all-true. An empty range (hi <=
    lo) gives a = b = lo."""
    hi = tl.maximum(hi, lo)
    a = lo
    if HAS_LEFT:  # n_start >= m_start + BLOCK_M - 1 + shift - left
        x = tl.maximum(m_start + BLOCK_M - 1 + shift - left, lo)
        a = tl.minimum((x + BLOCK_N - 1) // BLOCK_N * BLOCK_N, hi)
    z = len_k - BLOCK_N  # n_start + BLOCK_N <= len_k
    if HAS_RIGHT:  # n_start + BLOCK_N - 1 <= m_start + shift + right
        z = tl.minimum(z, m_start + shift + right - BLOCK_N + 1)
    b = tl.where(z < lo, lo, tl.minimum(z // BLOCK_N * BLOCK_N + BLOCK_N, hi))
    b = tl.maximum(b, a)
    return a, b
