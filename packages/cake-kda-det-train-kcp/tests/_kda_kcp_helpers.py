"""Shared helpers of the cake-kda-det-train-kcp tests (and of ``_kcp_worker.py``): global
inputs for each input kind, sharding, the single-rank reference (cake-kda-det-train on the
global tensors) and in-process runs.

Sizes are tiny on purpose (K = V = 16, one q/k head, tens of tokens): KDA under Triton's
interpreter costs about 0.65 s per 64-token chunk, value head and fwd+bwd call.

In one process (no ``torch.distributed``) a partition of world size 1 can still cross:
an explicit fragment table may give rank 0 several non-adjacent fragments of one
document, so the all-gather fold (a copy instead of the collective) and the ring
(hand-offs from rank 0 to itself) run their whole algorithm here.
"""

import torch
import torch.nn.functional as F
from cake_core.triton_utils import default_device

DEV = default_device()
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")
GATE_NAMES = ("dA_log", "ddt_bias")

#: relative Frobenius error allowed against the single-rank package (fp32 inputs): the
#: fold reassociates the recurrence and cuts regroup chunks
TOL = 2e-5
#: the same for dA_log / ddt_bias (sums over every token of terms of both signs; the
#: single-rank package's own tests allow 1e-4 against float64)
GATE_TOL = 1e-4

#: input kinds: the options of the call (besides the gate parameters, made per kind)
KINDS = {
    "plain": {},                                    # g = logsigmoid(randn), beta in (0, 1)
    "l2": {"use_qk_l2norm_in_kernel": True},
    "strong": {},                                   # g in (-20, 0) per channel and token
    # FLA's gate: -exp(A_log) softplus(g + dt_bias), beta pre-sigmoid
    "gate": {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True},
    # the lower-bound gate lb * sigmoid(exp(A_log) g) without dt_bias, and the L2 norm
    "gate_lb": {"use_gate_in_kernel": True, "lower_bound": -4.0,
                "use_qk_l2norm_in_kernel": True},
}


def global_inputs(T, H=1, HV=1, K=16, V=16, dtype=torch.float32, seed=0, device=None,
                  kind="plain"):
    """``(xs, kw)``: xs = [q, k, v, g, beta, do] of a packed batch of T tokens from ``seed``
    (k L2-normalised, g and beta fp32) and kw the options of ``kind`` (:data:`KINDS`) with
    its A_log / dt_bias, on ``device`` (DEV)."""
    dev = device or DEV
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    q = rn(1, T, H, K)
    k = F.normalize(rn(1, T, H, K), dim=-1)
    v = rn(1, T, HV, V)
    x = rn(1, T, HV, K)
    b = rn(1, T, HV)
    do = rn(1, T, HV, V)
    kw = dict(KINDS[kind])
    if kind == "strong":  # per channel: some rows of S nearly reset, others remember
        g = -20.0 * torch.sigmoid(2.0 * x)
    elif kind.startswith("gate"):
        g = 1.5 * x       # the raw gate
        kw["A_log"] = (0.5 * rn(HV) - 0.5).to(dev)
        if kind == "gate":
            kw["dt_bias"] = (0.5 * rn(HV * K)).to(dev)
    else:
        g = F.logsigmoid(x)
    beta = 2.0 * b if kw.get("use_beta_sigmoid_in_kernel") else torch.sigmoid(b)
    xs = [t.to(dev, dtype if i in (0, 1, 2, 5) else torch.float32)
          for i, t in enumerate((q, k, v, g, beta, do))]
    return xs, kw


def single_rank(xs, cu, kw):
    """o and gradients (then dA_log, ddt_bias, None where absent) of cake-kda-det-train on
    the global tensors."""
    from cake_kda_det_train import chunk_kda_det_bwd, chunk_kda_det_fwd

    o, _, saved = chunk_kda_det_fwd(*xs[:5], cu_seqlens=torch.tensor(cu, dtype=torch.int64,
                                                                     device=xs[0].device), **kw)
    gr = chunk_kda_det_bwd(xs[5], None, saved)
    return (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, gr.dA_log, gr.ddt_bias)


def shard(xs, partition, rank=0):
    idx = partition.global_index(rank).to(xs[0].device)
    return [t[:, idx].contiguous() for t in xs]


def kcp_run(local, ctx, kw, **more):
    """o and gradients (then dA_log, ddt_bias) of the low-level KCP pair on rank-local
    tensors."""
    from cake_kda_det_train_kcp import chunk_kda_det_bwd_kcp, chunk_kda_det_fwd_kcp

    extra = {n: more.pop(n) for n in ("plan", "workspace") if n in more}
    o, saved = chunk_kda_det_fwd_kcp(*local[:5], ctx, **kw, **extra, **more)
    return (o, *chunk_kda_det_bwd_kcp(local[5], saved, ctx, **extra))


def autograd_run(local, ctx, kw):
    """The same through the autograd entry (fresh leaves, gate parameters included)."""
    from cake_kda_det_train_kcp import chunk_kda_det_kcp

    leaves = [t.clone().requires_grad_() for t in local[:5]]
    kw = dict(kw)
    params = [kw.pop(n).clone().requires_grad_() if kw.get(n) is not None else None
              for n in ("A_log", "dt_bias")]
    o = chunk_kda_det_kcp(*leaves, ctx, A_log=params[0], dt_bias=params[1], **kw)
    o.backward(local[5])
    return (o.detach(), *(t.grad for t in leaves),
            *(p.grad if p is not None else None for p in params))


def local_rows(ref, partition, rank=0):
    """The single-rank results restricted to ``rank``'s tokens (gate sums unchanged)."""
    idx = partition.global_index(rank).to(ref[0].device)
    return [r[:, idx] if r is not None and r.dim() > 1 else r for r in ref]


#: document 0 over three fragments of rank 0 (first, middle, last), document 1's two
#: fragments between them (adjacent pieces of one document would merge): a cheap
#: partition with a transition P
CHAIN_CU = [0, 30, 34]
CHAIN_ROWS = [(0, 0, 0, 5), (0, 1, 0, 2), (0, 0, 5, 19), (0, 1, 2, 2), (0, 0, 24, 6)]
