"""Jitted helpers the forward and backward kernels share: a document's bounds and its TMA
descriptors, the mask, the (optionally soft-capped) scores in the log2 domain."""

from cake_core.triton_utils import select_backend

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
def tanh(x):
    """tanh from the sigmoid (no libdevice: the interpreter runs it too)."""
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


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
