"""FLA's in-kernel gate and beta options: elementwise fp32 prep and its backward.

Per token t and value head h (tensors flattened to ``[NT, HV]``), FLA's definitions:

    gate  = -exp(A_log[h]) * softplus(g[t, h] + dt_bias[h])     (use_gate_in_kernel)
    beta' = c * sigmoid(beta[t, h])                              (use_beta_sigmoid_in_kernel)

with c = ``BETA_SIGMOID`` = 1, or 2 with FLA's ``allow_neg_eigval`` (beta' in (0, 2)),

with FLA's softplus: ``x`` for ``x >= 20``, else ``log(1 + exp(x))`` (torch's default
threshold of 20; the exponent is clamped so the unused branch never overflows). The
backward, from the gradients dgate, dbeta' the chunk kernels produce (fp32):

    dg      = dgate * (-exp(A_log[h])) * sigmoid(g + dt_bias)   (softplus' = sigmoid)
    dbeta   = dbeta' * c * s * (1 - s),  s = sigmoid(beta)
    dA_log  = sum_t dgate * gate       ddt_bias = sum_t dg

The two sums are taken in two fixed stages: each program reduces its ``BLOCK_T`` tokens
(``tl.sum`` inside one program) into its own row of a partials buffer ``[NB, HV]``; the
host then adds the rows in index order (:func:`cake_core.gemm.ordered_sum`). No atomics.
One program per block of ``BLOCK_T`` tokens, all value heads (``BH`` >= HV, a power of two).
"""

import triton
import triton.language as tl

#: softplus(x) = x at and above this, as in FLA (and torch.nn.functional.softplus).
SOFTPLUS_THRESHOLD = 20.0


@triton.jit(do_not_specialize=["n_tok"])
def gdn_gate_fwd_kernel(
    G, BETA, A_LOG, DT_BIAS, G_OUT, BETA_OUT, n_tok, HV,
    USE_GATE: tl.constexpr, HAS_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr,
    THRESHOLD: tl.constexpr, BLOCK_T: tl.constexpr, BH: tl.constexpr,
):
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    h = tl.arange(0, BH)
    hmask = h < HV
    mask = (t < n_tok)[:, None] & hmask[None, :]
    off = t[:, None] * HV + h[None, :]
    if USE_GATE:
        x = tl.load(G + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + tl.load(DT_BIAS + h, mask=hmask, other=0.0).to(tl.float32)[None, :]
        neg_a = -tl.exp(tl.load(A_LOG + h, mask=hmask, other=0.0).to(tl.float32))
        sp = tl.where(x < THRESHOLD, tl.log(1.0 + tl.exp(tl.minimum(x, THRESHOLD))), x)
        tl.store(G_OUT + off, neg_a[None, :] * sp, mask=mask)
    if BETA_SIGMOID:
        b = tl.load(BETA + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(BETA_OUT + off, tl.sigmoid(b) * BETA_SIGMOID, mask=mask)


@triton.jit(do_not_specialize=["n_tok"])
def gdn_gate_bwd_kernel(
    G, BETA, A_LOG, DT_BIAS, DG, DBETA, DA_PART, DBIAS_PART, n_tok, HV,
    USE_GATE: tl.constexpr, HAS_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr,
    THRESHOLD: tl.constexpr, BLOCK_T: tl.constexpr, BH: tl.constexpr,
):
    """DG / DBETA (fp32 ``[NT, HV]``) hold the gradients w.r.t. the gate and the sigmoid's
    output on entry and are overwritten in place with those w.r.t. the raw g and beta (each
    element is read and written by the same program)."""
    pid = tl.program_id(0)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    h = tl.arange(0, BH)
    hmask = h < HV
    mask = (t < n_tok)[:, None] & hmask[None, :]
    off = t[:, None] * HV + h[None, :]
    if USE_GATE:
        x = tl.load(G + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + tl.load(DT_BIAS + h, mask=hmask, other=0.0).to(tl.float32)[None, :]
        neg_a = -tl.exp(tl.load(A_LOG + h, mask=hmask, other=0.0).to(tl.float32))
        sp = tl.where(x < THRESHOLD, tl.log(1.0 + tl.exp(tl.minimum(x, THRESHOLD))), x)
        gate = neg_a[None, :] * sp
        dgate = tl.load(DG + off, mask=mask, other=0.0)
        dx = neg_a[None, :] * (dgate * tl.sigmoid(x))
        dx = tl.where(mask, dx, 0.0)
        tl.store(DG + off, dx, mask=mask)
        tl.store(DA_PART + pid * HV + h, tl.sum(tl.where(mask, dgate * gate, 0.0), axis=0),
                 mask=hmask)
        if HAS_BIAS:
            tl.store(DBIAS_PART + pid * HV + h, tl.sum(dx, axis=0), mask=hmask)
    if BETA_SIGMOID:
        b = tl.load(BETA + off, mask=mask, other=0.0).to(tl.float32)
        s = tl.sigmoid(b)
        db = tl.load(DBETA + off, mask=mask, other=0.0)
        tl.store(DBETA + off, db * BETA_SIGMOID * s * (1.0 - s), mask=mask)
