"""The router's top-k softmax gate, one launch each way: softmax over the experts, the k
largest probabilities (ties to the lower expert index), their combine weights (optionally
divided by their sum), and the gradient back to the logits.

Each program owns whole token rows (all E experts of a row in one tile), so every reduction
is an in-register reduction of one row and every element is written by one program: no
atomics, equal inputs give equal bits.
"""

from __future__ import annotations

from cake_core.triton_utils import select_backend, tl, triton

select_backend()


@triton.jit(do_not_specialize=["n_tok"])
def route_fwd_kernel(
    LOGITS, PROBS, IDS, W, SUMW, n_tok, n_exp, stride_l,
    K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``PROBS = softmax(LOGITS)`` (fp32) per row; ``IDS[t, j]`` (int64) the j-th largest
    probability's expert, an equal probability to the lower index, NaN above every number
    (``torch.sort(descending=True, stable=True)``'s order); ``W[t, j] = PROBS[t, IDS[t,
    j]]``, divided by ``SUMW[t]`` (their sum in j order, fp32) with ``NORMALIZE``.
    Grid: (token blocks,)."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    tm = t < n_tok
    em = e < n_exp
    m = tm[:, None] & em[None, :]
    x = tl.load(LOGITS + t[:, None] * stride_l + e[None, :], mask=m, other=float("-inf"))
    x = tl.where(tm[:, None], x.to(tl.float32), 0.0)  # rows past the end: finite, unstored
    z = tl.exp(x - tl.max(x, axis=1)[:, None])
    z = tl.where(em[None, :], z, 0.0)
    p = z / tl.sum(z, axis=1)[:, None]
    tl.store(PROBS + t[:, None] * n_exp + e[None, :], p, mask=m)
    key = tl.where(p != p, 2.0, p)  # NaN ranks above every probability (torch.sort)
    key = tl.where(em[None, :], key, -1.0)
    kc = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
    w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    s = tl.zeros([BLOCK_T], dtype=tl.float32)
    for j in tl.static_range(K):
        top = tl.max(key, axis=1)
        idx = tl.min(tl.where(key == top[:, None], e[None, :], BLOCK_E), axis=1)
        sel = e[None, :] == idx[:, None]
        wj = tl.sum(tl.where(sel, p, 0.0), axis=1)
        s = s + wj
        ids = tl.where(kc[None, :] == j, idx.to(tl.int64)[:, None], ids)
        w = tl.where(kc[None, :] == j, wj[:, None], w)
        key = tl.where(sel, -2.0, key)
    if NORMALIZE:
        w = w / s[:, None]
        tl.store(SUMW + t, s, mask=tm)
    mk = tm[:, None] & (kc < K)[None, :]
    tl.store(IDS + t[:, None] * K + kc[None, :], ids, mask=mk)
    tl.store(W + t[:, None] * K + kc[None, :], w, mask=mk)


@triton.jit(do_not_specialize=["n_tok"])
def route_bwd_kernel(
    PROBS, IDS, W, SUMW, DW, DP, DLOGITS, n_tok, n_exp, stride_dl,
    K: tl.constexpr, NORMALIZE: tl.constexpr, HAS_DP: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Gradient of the logits from ``DW`` (of the weights W) and ``DP`` (of PROBS, with
    ``HAS_DP``): the selected probabilities get ``DW`` (with ``NORMALIZE``:
    ``(DW[j] - Σ_i DW[i] W[i]) / SUMW``), added to ``DP`` at ``IDS`` (distinct per row: one
    add per element), then ``DLOGITS = P * (G - Σ_e P G)``; fp32, stored in DLOGITS' dtype.
    Grid: (token blocks,)."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    kc = tl.arange(0, BLOCK_K)
    tm = t < n_tok
    m = tm[:, None] & (e < n_exp)[None, :]
    mk = tm[:, None] & (kc < K)[None, :]
    p = tl.load(PROBS + t[:, None] * n_exp + e[None, :], mask=m, other=0.0)
    if HAS_DP:
        g = tl.load(DP + t[:, None] * n_exp + e[None, :], mask=m, other=0.0).to(tl.float32)
    else:
        g = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    ids = tl.load(IDS + t[:, None] * K + kc[None, :], mask=mk, other=-1)
    dw = tl.load(DW + t[:, None] * K + kc[None, :], mask=mk, other=0.0).to(tl.float32)
    if NORMALIZE:
        w = tl.load(W + t[:, None] * K + kc[None, :], mask=mk, other=0.0)
        s = tl.load(SUMW + t, mask=tm, other=1.0)
        dw = (dw - tl.sum(dw * w, axis=1)[:, None]) / s[:, None]
    for j in tl.static_range(K):
        idj = tl.sum(tl.where(kc[None, :] == j, ids, 0), axis=1)
        dwj = tl.sum(tl.where(kc[None, :] == j, dw, 0.0), axis=1)
        g = g + tl.where(e[None, :] == idj[:, None], dwj[:, None], 0.0)
    dl = p * (g - tl.sum(p * g, axis=1)[:, None])
    tl.store(DLOGITS + t[:, None] * stride_dl + e[None, :], dl.to(DLOGITS.dtype.element_ty),
             mask=m)
