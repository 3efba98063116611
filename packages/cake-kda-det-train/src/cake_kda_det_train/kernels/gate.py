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

The gate's forward and backward run inside the chunk kernels that form G and dg
(``kda_chunk_cumsum_kernel``, ``kda_bwd_dg_cumsum_kernel``), which call :func:`_gate_math`.
The sums run over every token of every sequence in two fixed stages: each chunk's program
reduces its tokens into its own slot of a partials buffer (``[NC, HV]`` for dA_log,
``[NC, HV * K]`` for ddt_bias); the host then adds the rows in chunk order
(:func:`cake_core.gemm.ordered_sum`). No atomics. The beta sigmoid's kernels run on a grid
``(NB, HV)``: one program per block of ``BLOCK_T`` tokens and value head.
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
def kda_beta_bwd_kernel(BETA, DBETA, n_tok, HV, BETA_SIGMOID: tl.constexpr,
                        BLOCK_T: tl.constexpr):
    """DBETA (fp32 ``[NT, HV]``) holds the gradient w.r.t. beta' on entry and is
    overwritten in place with the gradient w.r.t. the pre-sigmoid BETA (each element read
    and written by the same program). (The gate's backward runs in the chunk backward's
    last kernel, ``kernels/chunk_bwd.py``'s ``kda_bwd_dg_cumsum_kernel``.)"""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    t = (pid * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    tmask = t < n_tok
    b = tl.load(BETA + t * HV + h, mask=tmask, other=0.0).to(tl.float32)
    s = tl.sigmoid(b)
    db = tl.load(DBETA + t * HV + h, mask=tmask, other=0.0)
    tl.store(DBETA + t * HV + h, db * BETA_SIGMOID * s * (1.0 - s), mask=tmask)
