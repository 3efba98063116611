"""Bad inputs raise ValueError before any launch or collective (in one process; the
live-group cases, a context from another rank and a partition for another world size,
run in test_gdn_kcp_dist.py)."""

import cake_gdn_det_train_kcp.api as kcp_api
import pytest
import torch
from _gdn_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_core.kcp import build_context
from cake_core.testing import assert_raises_unmodified
from cake_gdn_det_train_kcp import (
    build_context_det_kcp,
    chunk_gated_delta_rule_det_kcp,
    chunk_gdn_det_bwd_kcp,
    chunk_gdn_det_fwd_kcp,
    partition_det_kcp,
)


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    local = shard(global_inputs(100, seed=31), p)
    _, saved = chunk_gdn_det_fwd_kcp(*local[:5], ctx)
    return ctx, local, saved


@pytest.fixture
def no_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in ("chunk_gdn_det_bwd", "chunk_gdn_det_fwd", "forward_allgather", "forward_ring",
                 "backward_allgather", "backward_ring"):
        monkeypatch.setattr(kcp_api, name, boom)


def _args(local, ctx, over):
    d = dict(q=local[0], k=local[1], v=local[2], g=local[3], beta=local[4], ctx=ctx)
    d.update(over)
    return d


def _cases(local, ctx):
    q, k, v, g, beta, do = local
    longer = [torch.cat([t, t[:, :1]], dim=1) for t in local]
    w2 = partition_det_kcp(CROSS_CU, 2)
    return [
        (dict(ctx=None), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=w2), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=build_context(w2, None, 0, DEV, check_group=False)),
         "^ctx: made for world_size 2, but torch.distributed is not initialised"),
        (dict(ctx=build_context(w2, None, 1, DEV, check_group=False)), "^ctx: made for"),
        (dict(q=longer[0], k=longer[1], v=longer[2], g=longer[3], beta=longer[4]),
         "^q: holds 101 tokens, but rank 0's context has 100"),
        (dict(q=q[:, :99], k=k[:, :99], v=v[:, :99], g=g[:, :99], beta=beta[:, :99]),
         "^q: holds 99 tokens"),
        (dict(q=q.expand(2, -1, -1, -1), k=k.expand(2, -1, -1, -1), v=v.expand(2, -1, -1, -1),
              g=g.expand(2, -1, -1), beta=beta.expand(2, -1, -1)), "^q: expected the rank-local"),
        (dict(q=q.double()), "^q: expected dtype"),
        (dict(k=k.half()), "^k: expected dtype"),
        (dict(v=v.to(torch.bfloat16)), "^v: expected dtype"),
        (dict(g=g.double()), "^g: expected dtype"),
        (dict(beta=beta.to(torch.int32)), "^beta: expected dtype"),
        (dict(g=g[..., None]), "^g: expected shape"),
        (dict(v=v[:, :, :, :0]), "^v: head dim V"),
        (dict(scale=-1.0), "^scale"),
        (dict(use_qk_l2norm_in_kernel=1), "^use_qk_l2norm_in_kernel"),
    ]


def test_forward_bad_inputs(setup, no_work):
    ctx, local, _ = setup
    for over, match in _cases(local, ctx):
        assert_raises_unmodified(chunk_gdn_det_fwd_kcp, _args(local, ctx, over), match)
        assert_raises_unmodified(chunk_gated_delta_rule_det_kcp, _args(local, ctx, over),
                                 match)


def test_backward_bad_inputs(setup, no_work):
    ctx, local, saved = setup
    do = local[5]
    for d, match in ((do[:, :99], "^do: expected shape"), (do.double(), "^do: expected dtype"),
                     (do.to(torch.int32), "^do: expected dtype"), (None, "^do: expected a")):
        with pytest.raises(ValueError, match=match):
            chunk_gdn_det_bwd_kcp(d, saved, ctx)
    with pytest.raises(ValueError, match="^ctx: expected"):
        chunk_gdn_det_bwd_kcp(do, saved, ctx.partition)
