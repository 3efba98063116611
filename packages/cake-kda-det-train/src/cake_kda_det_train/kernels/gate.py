"""FLA's in-kernel KDA gate and beta sigmoid: the gate's math (its forward runs inside the
chunk cumulative-sum kernel, kernels/chunk_fwd.py), the beta sigmoid's forward kernel and
the backward of both.

Per token t, value head h and key channel c (g flattened to ``[NT, HV, K]``, beta to
``[NT, HV]``), with ``x = g[t, h, c] + dt_bias[h * K + c]`` (FLA's ``fla/ops/kda/gate.py``):

    gate = -exp(A_log[h]) * softplus(x)            LOWER_BOUND = False (A_log required)
    gate = lb * sigmoid(a * x)                     LOWER_BOUND = True, a = exp(A_log[h]),
                                                   or a = 1 without A_log (HAS_A = False)
    beta' = c_b * sigmoid(beta[t, h])              c_b = BETA_SIGMOID: 1, or 2 with FLA's
                                                   allow_neg_eigval

FLA's softplus: ``x`` for ``x > 20``, else ``log(1 + exp(x))`` (the exponent is clamped so
the unused branch never overflows). The backward, from the fp32 gradients dgate, dbeta'
of the chunk kernels:

    softplus form:     dx = dgate * (-exp(A_log)) * sigmoid(x)     dA_log = sum dgate * gate
    lower-bound form:  dx = dgate * lb * s (1 - s) * a, s = sigmoid(a x)
                                                                   dA_log = sum dx * x
    dbeta = dbeta' * c_b * s_b (1 - s_b), s_b = sigmoid(beta)      ddt_bias = sum_t dx

The sums run over every token of every sequence in two fixed stages: each program reduces
its ``BLOCK_T`` tokens (``tl.sum`` inside one program) into its own slot of a partials
buffer (``[NB, HV]`` for dA_log, ``[NB, HV * K]`` for ddt_bias); the host then adds the
rows in index order (:func:`cake_core.gemm.ordered_sum`). No atomics. Grid: ``(NB, HV)``,
one program per block of ``BLOCK_T`` tokens and value head, the whole K (``BK >= K``).
"""

import triton
import triton.language as tl

#: softplus(x) = x above this, as in FLA (and torch.nn.functional.softplus).
SOFTPLUS_THRESHOLD = 20.0


@triton.jit
def _gate_math(x, a_raw, lb, HAS_A: tl.constexpr, LOWER_BOUND: tl.constexpr,
               THRESHOLD: tl.constexpr):
    """``(gate, dgate/dx, a)`` of x (fp32 tile) for one value head; ``a_raw`` = A_log[h]."""
    if LOWER_BOUND:
        if HAS_A:
            a = tl.exp(a_raw)
        else:
            a = 1.0
        s = tl.sigmoid(a * x)
        gate = lb * s
        dgate_dx = lb * s * (1.0 - s) * a
    else:
        a = -tl.exp(a_raw)
        sp = tl.where(x > THRESHOLD, x, tl.log(1.0 + tl.exp(tl.minimum(x, THRESHOLD))))
        gate = a * sp
        dgate_dx = a * tl.sigmoid(x)
    return gate, dgate_dx


@triton.jit(do_not_specialize=["n_tok"])
def kda_beta_fwd_kernel(BETA, BETA_OUT, n_tok, HV, BETA_SIGMOID: tl.constexpr,
                        BLOCK_T: tl.constexpr):
    """BETA_OUT (fp32 ``[NT, HV]``) = BETA_SIGMOID * sigmoid(BETA), BETA contiguous, any
    float dtype. (The gate's forward runs inside the chunk cumulative-sum kernel:
    ``kernels/chunk_fwd.py``'s ``kda_chunk_cumsum_kernel`` calls :func:`_gate_math`.)"""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tmask = t < n_tok
    b = tl.load(BETA + t * HV + h, mask=tmask, other=0.0).to(tl.float32)
    tl.store(BETA_OUT + t * HV + h, tl.sigmoid(b) * BETA_SIGMOID, mask=tmask)


@triton.jit(do_not_specialize=["n_tok"])
def kda_gate_bwd_kernel(
    G, BETA, A_LOG, DT_BIAS, DG, DBETA, DA_PART, DBIAS_PART, lower_bound, n_tok, HV, KD,
    USE_GATE: tl.constexpr, HAS_A: tl.constexpr, HAS_BIAS: tl.constexpr,
    LOWER_BOUND: tl.constexpr, BETA_SIGMOID: tl.constexpr, THRESHOLD: tl.constexpr,
    BLOCK_T: tl.constexpr, BK: tl.constexpr,
):
    """DG (fp32 ``[NT, HV, K]``) and DBETA (fp32 ``[NT, HV]``) hold the gradients w.r.t.
    the gate and beta' on entry and are overwritten in place with those w.r.t. the raw g
    and beta (each element is read and written by the same program). DA_PART[pid, h] and
    DBIAS_PART[pid, h * K + c] (fp32) get this block's sums (0.0 for masked tokens)."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tmask = t < n_tok
    if USE_GATE:
        c = tl.arange(0, BK)
        cmask = c < KD
        mask = tmask[:, None] & cmask[None, :]
        off = (t[:, None] * HV + h) * KD + c[None, :]
        x = tl.load(G + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x = x + tl.load(DT_BIAS + h * KD + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
        a_raw = 0.0
        if HAS_A:
            a_raw = tl.load(A_LOG + h).to(tl.float32)
        gate, dgate_dx = _gate_math(x, a_raw, lower_bound, HAS_A, LOWER_BOUND, THRESHOLD)
        dgate = tl.load(DG + off, mask=mask, other=0.0)
        dx = tl.where(mask, dgate * dgate_dx, 0.0)
        tl.store(DG + off, dx, mask=mask)
        if HAS_A:
            if LOWER_BOUND:
                da = tl.where(mask, dx * x, 0.0)
            else:
                da = tl.where(mask, dgate * gate, 0.0)
            tl.store(DA_PART + pid * HV + h, tl.sum(tl.sum(da, axis=1), axis=0))
        if HAS_BIAS:
            tl.store(DBIAS_PART + (pid * HV + h) * KD + c, tl.sum(dx, axis=0), mask=cmask)
    if BETA_SIGMOID:
        b = tl.load(BETA + t * HV + h, mask=tmask, other=0.0).to(tl.float32)
        s = tl.sigmoid(b)
        db = tl.load(DBETA + t * HV + h, mask=tmask, other=0.0)
        tl.store(DBETA + t * HV + h, db * BETA_SIGMOID * s * (1.0 - s), mask=tmask)
