"""Bad inputs raise ValueError before any launch or collective and modify nothing the
caller passed (in one process; the live-group cases, a context from another rank and a
partition for another world size, run in test_conv_kcp_dist.py)."""

import cake_causal_conv1d_det_train_kcp.api as kcp_api
import pytest
import torch
from _conv_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_causal_conv1d_det_train_kcp import (
    build_context_det_kcp,
    causal_conv1d_det_bwd_kcp,
    causal_conv1d_det_fwd_kcp,
    causal_conv1d_det_kcp,
    partition_det_kcp,
)
from cake_core.kcp import build_context
from cake_core.testing import assert_raises_unmodified


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    local = shard(global_inputs(60, 8, 4, seed=31), p)
    _, saved = causal_conv1d_det_fwd_kcp(*local[:3], ctx)
    return ctx, local, saved


@pytest.fixture
def no_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in ("causal_conv1d_det_fwd", "causal_conv1d_det_bwd", "all_gather_bytes",
                 "device_halo"):
        monkeypatch.setattr(kcp_api, name, boom)


def _args(local, ctx, over):
    d = dict(x=local[0], weight=local[1], bias=local[2], ctx=ctx)
    d.update(over)
    return d


def _cases(local, ctx):
    x, w, b, _ = local
    w2 = partition_det_kcp(CROSS_CU, 2)
    return [
        (dict(ctx=None), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=w2), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=build_context(w2, None, 0, DEV, 4, check_group=False)),
         "^ctx: made for world_size 2, but torch.distributed is not initialised"),
        (dict(ctx=build_context(w2, None, 1, DEV, 4, check_group=False)), "^ctx: made for"),
        (dict(ctx=build_context_det_kcp(ctx.partition, None, 0, DEV, 3)),
         "^ctx: built with conv_kernel_size=3, but weight has W=4 taps"),
        (dict(ctx=build_context_det_kcp(ctx.partition, None, 0, "meta", 4)),
         "^ctx: built for device meta"),
        (dict(x=torch.cat([x, x[:, :1]], 1)), "^x: holds 61 tokens, but rank 0's context has 60"),
        (dict(x=x[:, :59]), "^x: holds 59 tokens"),
        (dict(x=x.expand(2, -1, -1)), "^x: expected the rank-local"),
        (dict(x=x[0]), "^x: expected 3"),
        (dict(x=x.double()), "^x: expected dtype"),
        (dict(x=x.to(torch.int32)), "^x: expected dtype"),
        (dict(x=x.transpose(1, 2).contiguous().transpose(1, 2)), "^x: last dimension must be "
                                                                  "contiguous"),
        (dict(x=list(x)), "^x: expected a"),
        (dict(weight=w[:4]), r"^weight: expected shape \[8, W\] \(\[D, W\]: one filter"),
        (dict(weight=w[:, :1]), r"^weight: kernel size W must be in \[2, 8\]"),
        (dict(weight=w.half()), "^weight: expected dtype"),
        (dict(weight=w.t().contiguous().t()), "^weight: last dimension"),
        (dict(weight=w.to("meta")), "^weight: on meta"),
        (dict(bias=b[:4]), "^bias: expected shape"),
        (dict(bias=b.double()), "^bias: expected dtype"),
        (dict(bias=b.tolist()), "^bias: expected a"),
        (dict(activation="relu"), "^activation: expected None, 'silu' or 'swish'"),
        (dict(activation=1), "^activation"),
    ]


def test_forward_bad_inputs(setup, no_work):
    ctx, local, _ = setup
    for over, match in _cases(local, ctx):
        assert_raises_unmodified(causal_conv1d_det_fwd_kcp, _args(local, ctx, over), match)
        assert_raises_unmodified(causal_conv1d_det_kcp, _args(local, ctx, over), match)
    assert_raises_unmodified(causal_conv1d_det_kcp,
                             _args(local, ctx, dict(reduce_weight_grads=1)),
                             "^reduce_weight_grads: expected a bool")


def test_backward_bad_inputs(setup, no_work):
    ctx, local, saved = setup
    dy = local[3]
    for d, match in ((dy[:, :59], "^dy: expected shape"), (dy.double(), "^dy: expected dtype"),
                     (dy.to(torch.int32), "^dy: expected dtype"), (None, "^dy: expected a"),
                     (dy.transpose(1, 2).contiguous().transpose(1, 2), "^dy: last dimension"),
                     (dy.to("meta"), "^dy: on meta")):
        assert_raises_unmodified(causal_conv1d_det_bwd_kcp, dict(dy=d, saved=saved, ctx=ctx),
                                 match)
    assert_raises_unmodified(causal_conv1d_det_bwd_kcp,
                             dict(dy=dy, saved=saved, ctx=ctx, reduce_weight_grads=None),
                             "^reduce_weight_grads: expected a bool")
    with pytest.raises(ValueError, match="^ctx: expected"):
        causal_conv1d_det_bwd_kcp(dy, saved, ctx.partition)
