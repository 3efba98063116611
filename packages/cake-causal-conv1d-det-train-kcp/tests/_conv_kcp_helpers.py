"""Shared helpers of the cake-causal-conv1d-det-train-kcp tests (and of ``_kcp_worker.py``):
global inputs, sharding, the single-rank package and the float64 reference on the global
tensors, and KCP runs.

In one process (no ``torch.distributed``) a partition of world size 1 can still cross:
an explicit fragment table may give rank 0 several non-adjacent fragments of one
document, so the halo assembly (own rows) and the halo-gradient sums run here, in
seconds; the all-gathers need ``_kcp_worker.py``'s process groups.
"""

import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device

DEV = default_device()
NAMES = ("y", "dx", "dweight", "dbias")
#: relative Frobenius error allowed against the single-rank package and the float64
#: reference (fp32: a continuing fragment adds its halo taps after its own taps, and the
#: halo gradient after the local one)
TOL = 1e-5


def global_inputs(T, D, W, *, bias=True, dtype=torch.float32, param_dtype=None, seed=0,
                  device=None):
    """x, weight, bias (or None), dy of a packed batch of T tokens, from ``seed``."""
    dev = device or DEV
    pdt = param_dtype or dtype
    return (randn((1, T, D), dtype, dev, seed=seed),
            randn((D, W), pdt, dev, seed=seed + 1, scale=0.5),
            randn((D,), pdt, dev, seed=seed + 2) if bias else None,
            randn((1, T, D), dtype, dev, seed=seed + 3))


def single_rank(xs, cu, activation=None):
    """y, dx, dweight, dbias of cake-causal-conv1d-det-train on the global tensors."""
    from cake_causal_conv1d_det_train import causal_conv1d_det_bwd, causal_conv1d_det_fwd

    x, w, b, dy = xs
    cu_t = torch.tensor(cu, dtype=torch.int64, device=x.device)
    y, _, saved = causal_conv1d_det_fwd(x, w, b, activation=activation, cu_seqlens=cu_t)
    gr = causal_conv1d_det_bwd(dy, None, saved)
    return (y, gr.dx, gr.dweight, gr.dbias)


def reference64(xs, cu, activation=None):
    """The same in float64 (reference.py and torch autograd)."""
    from cake_causal_conv1d_det_train import causal_conv1d_reference

    x, w, b, dy = (t.detach().double().requires_grad_() if t is not None else None
                   for t in xs)
    y, _ = causal_conv1d_reference(x, w, b, activation=activation,
                                   cu_seqlens=torch.tensor(cu, dtype=torch.int64),
                                   dtype=torch.float64)
    y.backward(dy.detach())
    return (y.detach(), x.grad, w.grad, b.grad if b is not None else None)


def shard(xs, partition, rank=0):
    """x and dy of rank ``rank`` (weight and bias are shared)."""
    idx = partition.global_index(rank).to(xs[0].device)
    x, w, b, dy = xs
    return (x[:, idx].contiguous(), w, b, dy[:, idx].contiguous())


def kcp_run(local, ctx, activation=None, reduce_weight_grads=False, **kw):
    """y, dx, dweight, dbias of the low-level KCP pair on rank-local tensors."""
    from cake_causal_conv1d_det_train_kcp import (
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
    )

    x, w, b, dy = local
    y, saved = causal_conv1d_det_fwd_kcp(x, w, b, ctx, activation=activation, **kw)
    gr = causal_conv1d_det_bwd_kcp(dy, saved, ctx, reduce_weight_grads=reduce_weight_grads,
                                   **kw)
    return (y, gr.dx, gr.dweight, gr.dbias)


def autograd_run(local, ctx, activation=None, reduce_weight_grads=False, **kw):
    """The same through the autograd entry."""
    from cake_causal_conv1d_det_train_kcp import causal_conv1d_det_kcp

    x, w, b, dy = local
    leaves = [t.detach().clone().requires_grad_() if t is not None else None
              for t in (x, w, b)]
    y = causal_conv1d_det_kcp(*leaves, ctx, activation=activation,
                              reduce_weight_grads=reduce_weight_grads, **kw)
    y.backward(dy)
    return (y.detach(), leaves[0].grad, leaves[1].grad,
            leaves[2].grad if leaves[2] is not None else None)


#: documents [0, 12), [12, 13), [13, 40), [40, 60) on one rank, as fragments
#: (rank, doc, doc_offset, length): document 0 in three pieces (a 1-token one), document 2 in
#: four (two of 1 token: with W = 4 the last one's halo spans three earlier fragments)
CROSS_CU = [0, 12, 13, 40, 60]
CROSS_ROWS = [(0, 0, 0, 6), (0, 2, 0, 10), (0, 0, 6, 1), (0, 3, 0, 20), (0, 2, 10, 1),
              (0, 0, 7, 5), (0, 2, 11, 1), (0, 1, 0, 1), (0, 2, 12, 15)]
