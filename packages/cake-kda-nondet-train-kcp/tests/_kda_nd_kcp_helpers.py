"""Shared helpers of the cake-kda-nondet-train-kcp tests (and of ``_nd_kcp_worker.py``):
global inputs, sharding, the single-rank reference (cake-kda-nondet-train on the global
tensors) and in-process runs. Tiny sizes: the kernels run through Triton's interpreter.

In one process a partition of world size 1 can still cross: an explicit fragment table may
give rank 0 several non-adjacent fragments of one document, so the all-gather fold and the
ring run their whole algorithm here.
"""

import torch
import torch.nn.functional as F
from cake_core.triton_utils import default_device

DEV = default_device()
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")
#: relative Frobenius error allowed against the single-rank package (fp32): the fold
#: reassociates the recurrence and cuts regroup chunks
TOL = 2e-5
#: the same for dA_log / ddt_bias (sums over every token of terms of both signs)
GATE_TOL = 1e-4

#: document 0 over three fragments of rank 0 (first, middle, last), document 1's two
#: fragments between them: a cheap partition with a transition P
CHAIN_CU = [0, 30, 34]
CHAIN_ROWS = [(0, 0, 0, 5), (0, 1, 0, 2), (0, 0, 5, 19), (0, 1, 2, 2), (0, 0, 24, 6)]


def global_inputs(T, H=1, HV=1, K=16, V=16, seed=0, device=None, gate=True):
    """``(xs, kw)``: xs = [q, k, v, g, beta, do] fp32 of a packed batch of T tokens and kw
    the options: with ``gate`` FLA's in-kernel gate (raw g, A_log, dt_bias) and the beta
    sigmoid (Kimi Linear's call), else a log-sigmoid decay and beta in (0, 1)."""
    dev = device or DEV
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = rn(1, T, H, K), F.normalize(rn(1, T, H, K), dim=-1)
    v, x, b, do = rn(1, T, HV, V), rn(1, T, HV, K), rn(1, T, HV), rn(1, T, HV, V)
    kw = {}
    if gate:
        g, beta = 1.5 * x, 2.0 * b
        kw = {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True,
              "A_log": (0.5 * rn(HV) - 0.5).to(dev), "dt_bias": (0.5 * rn(HV * K)).to(dev)}
    else:
        g, beta = F.logsigmoid(x), torch.sigmoid(b)
    return [t.to(dev) for t in (q, k, v, g, beta, do)], kw


def single_rank(xs, cu, kw):
    """o and gradients (then dA_log, ddt_bias) of cake-kda-nondet-train on the global
    tensors."""
    from cake_kda_nondet_train import chunk_kda_nondet_bwd, chunk_kda_nondet_fwd

    cu_t = torch.tensor(cu, dtype=torch.int64, device=xs[0].device)
    o, _, saved = chunk_kda_nondet_fwd(*xs[:5], cu_seqlens=cu_t, **kw)
    gr = chunk_kda_nondet_bwd(xs[5], None, saved)
    return (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta, gr.dA_log, gr.ddt_bias)


def shard(xs, partition, rank=0):
    idx = partition.global_index(rank).to(xs[0].device)
    return [t[:, idx].contiguous() for t in xs]


def local_rows(ref, partition, rank=0):
    """The single-rank results restricted to ``rank``'s tokens (gate sums unchanged)."""
    idx = partition.global_index(rank).to(ref[0].device)
    return [r[:, idx] if r is not None and r.dim() > 1 else r for r in ref]


def kcp_run(local, ctx, kw, **more):
    """o and gradients (then dA_log, ddt_bias) of the low-level KCP pair on rank-local
    tensors."""
    from cake_kda_nondet_train_kcp import chunk_kda_nondet_bwd_kcp, chunk_kda_nondet_fwd_kcp

    extra = {n: more.pop(n) for n in ("plan", "workspace") if n in more}
    o, saved = chunk_kda_nondet_fwd_kcp(*local[:5], ctx, **kw, **extra, **more)
    return (o, *chunk_kda_nondet_bwd_kcp(local[5], saved, ctx, **extra))


def autograd_run(local, ctx, kw):
    """The same through the autograd entry (fresh leaves, gate parameters included)."""
    from cake_kda_nondet_train_kcp import chunk_kda_nondet_kcp

    leaves = [t.clone().requires_grad_() for t in local[:5]]
    kw = dict(kw)
    params = [kw.pop(n).clone().requires_grad_() if kw.get(n) is not None else None
              for n in ("A_log", "dt_bias")]
    o = chunk_kda_nondet_kcp(*leaves, ctx, A_log=params[0], dt_bias=params[1], **kw)
    o.backward(local[5])
    return (o.detach(), *(t.grad for t in leaves),
            *(p.grad if p is not None else None for p in params))


def assert_close_all(got, want, names=NAMES):
    """Each pair within :data:`TOL` (gate sums :data:`GATE_TOL`), ``None`` together."""
    from cake_core.testing import rel_fro_error

    for n, a, b in zip(names, got, want, strict=True):
        assert (a is None) == (b is None), n
        if a is not None:
            tol = GATE_TOL if n in ("dA_log", "ddt_bias") else TOL
            err = rel_fro_error(a, b)
            assert err <= tol, f"{n}: relative error {err:.3g} > {tol:g}"
