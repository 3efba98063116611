"""Shared helpers of the cake-gdn-nondet-train-kcp tests (and of ``_nd_kcp_worker.py``):
global inputs, sharding, the single-rank nondet package on the global tensors, the
low-level KCP pair.

In one process a partition of world size 1 can still cross: an explicit fragment table
gives rank 0 several non-adjacent fragments of one document, so the all-gather fold and
the ring run their whole algorithm here.
"""

import torch
import torch.nn.functional as F
from cake_core.triton_utils import default_device

DEV = default_device()
NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def global_inputs(T, H=1, HV=1, K=16, V=16, seed=0, device=None):
    """fp32 q, k, v, g, beta, do of a packed batch of T tokens (k L2-normalised, g =
    logsigmoid, beta = sigmoid), from ``seed``, on ``device`` (DEV)."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    q = rn(1, T, H, K)
    k = F.normalize(rn(1, T, H, K), dim=-1)
    v = rn(1, T, HV, V)
    g = F.logsigmoid(rn(1, T, HV))
    beta = torch.sigmoid(rn(1, T, HV))
    do = rn(1, T, HV, V)
    return tuple(t.to(device or DEV) for t in (q, k, v, g, beta, do))


def single_rank(xs, cu, l2=False):
    """o and gradients of cake-gdn-nondet-train on the global tensors."""
    from cake_gdn_nondet_train import chunk_gdn_nondet_bwd, chunk_gdn_nondet_fwd

    o, _, saved = chunk_gdn_nondet_fwd(*xs[:5], use_qk_l2norm_in_kernel=l2,
                                       cu_seqlens=torch.tensor(cu, dtype=torch.int64,
                                                               device=xs[0].device))
    gr = chunk_gdn_nondet_bwd(xs[5], None, saved)
    return (o, gr.dq, gr.dk, gr.dv, gr.dg, gr.dbeta)


def shard(xs, partition, rank=0):
    idx = partition.global_index(rank).to(xs[0].device)
    return [t[:, idx].contiguous() for t in xs]


def kcp_run(local, ctx, l2=False, **kw):
    """o and gradients of the low-level nondet KCP pair on rank-local tensors."""
    from cake_gdn_nondet_train_kcp import chunk_gdn_nondet_bwd_kcp, chunk_gdn_nondet_fwd_kcp

    o, saved = chunk_gdn_nondet_fwd_kcp(*local[:5], ctx, use_qk_l2norm_in_kernel=l2, **kw)
    return (o, *chunk_gdn_nondet_bwd_kcp(local[5], saved, ctx, **kw))


#: documents [0, 70), [70, 85), [85, 100); rank 0 holds document 0 in three fragments
#: (the middle one receives and sends), document 1 in two, document 2 whole
CROSS_CU = [0, 70, 85, 100]
CROSS_ROWS = [(0, 0, 0, 30), (0, 1, 0, 10), (0, 0, 30, 20), (0, 1, 10, 5), (0, 0, 50, 20),
              (0, 2, 0, 15)]
