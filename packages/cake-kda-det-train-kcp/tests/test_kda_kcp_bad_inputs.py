"""Bad inputs raise ValueError before any launch or collective, and leave the caller's
tensors as they were (in one process; the live-group cases, a context from another rank
and a partition for another world size, run in test_kda_kcp_dist.py). The forward's
checks of tensors and options are the single-rank package's: the same messages."""

import cake_kda_det_train_kcp.api as kcp_api
import pytest
import torch
from _kda_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core.kcp import build_context
from cake_core.testing import assert_raises_unmodified
from cake_kda_det_train_kcp import (
    build_context_det_kcp,
    chunk_kda_det_bwd_kcp,
    chunk_kda_det_fwd_kcp,
    chunk_kda_det_kcp,
    partition_det_kcp,
)

WORK = ("chunk_kda_det_bwd", "chunk_kda_det_fwd", "forward_allgather", "forward_ring",
        "backward_allgather", "backward_ring", "sum_over_ranks")


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=31, kind="gate")
    local = shard(xs, p)
    _, saved = chunk_kda_det_fwd_kcp(*local[:5], ctx, **kw)
    return ctx, local, kw, saved


@pytest.fixture
def no_work(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("work started before the checks finished")

    for name in WORK:
        monkeypatch.setattr(kcp_api, name, boom)


def _args(local, ctx, kw, over):
    d = dict(q=local[0], k=local[1], v=local[2], g=local[3], beta=local[4], ctx=ctx, **kw)
    d.update(over)
    return d


def _kcp_cases(local, ctx):
    """Cases only the KCP entry has (the context, the rank-local layout)."""
    q, k, v, g, beta, _ = local
    T = q.shape[1]
    longer = [torch.cat([t, t[:, :1]], dim=1) for t in local]
    w2 = partition_det_kcp(CHAIN_CU, 2)
    return [
        (dict(ctx=None), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=w2), "^ctx: expected a cake_core.kcp.Context"),
        (dict(ctx=build_context(w2, None, 0, DEV, check_group=False)),
         "^ctx: made for world_size 2, but torch.distributed is not initialised"),
        (dict(ctx=build_context(w2, None, 1, DEV, check_group=False)), "^ctx: made for"),
        (dict(q=longer[0], k=longer[1], v=longer[2], g=longer[3], beta=longer[4]),
         f"^q: holds {T + 1} tokens, but rank 0's context has {T}"),
        (dict(q=q[:, :-1], k=k[:, :-1], v=v[:, :-1], g=g[:, :-1], beta=beta[:, :-1]),
         f"^q: holds {T - 1} tokens"),
        (dict(q=q.expand(2, -1, -1, -1), k=k.expand(2, -1, -1, -1), v=v.expand(2, -1, -1, -1),
              g=g.expand(2, -1, -1, -1), beta=beta.expand(2, -1, -1)),
         "^q: expected the rank-local"),
        (dict(reduce_gate_param_grads=1), "^reduce_gate_param_grads"),
        (dict(reduce_gate_param_grads=None), "^reduce_gate_param_grads"),
    ]


def _shared_cases(local, kw):
    """Cases of the single-rank package's rules (tensors, options, gate parameters)."""
    q, k, v, g, beta, _ = local
    A_log, dt_bias = kw["A_log"], kw["dt_bias"]
    return [
        (dict(q=q.double()), "^q: expected dtype"),
        (dict(k=k.half()), "^k: expected dtype"),
        (dict(v=v.to(torch.bfloat16)), "^v: expected dtype"),
        (dict(g=g.double()), "^g: expected dtype"),
        (dict(g=g[..., 0]), "^g: expected shape"),                 # GDN's per-head decay
        (dict(beta=beta.to(torch.int32)), "^beta: expected dtype"),
        (dict(v=v[:, :, :, :0]), "^v: head dim V"),
        (dict(scale=-1.0), "^scale"),
        (dict(use_qk_l2norm_in_kernel=1), "^use_qk_l2norm_in_kernel"),
        (dict(use_gate_in_kernel="yes"), "^use_gate_in_kernel"),
        (dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=False), "^allow_neg_eigval"),
        (dict(A_log=None), "^A_log: required"),
        (dict(A_log=A_log[:, None]), "^A_log: expected shape"),
        (dict(A_log=A_log.double()), "^A_log: expected dtype"),
        (dict(dt_bias=dt_bias[: A_log.numel()]), "^dt_bias: expected shape"),  # GDN's shape
        (dict(dt_bias=dt_bias.half()), "^dt_bias: expected dtype"),
        (dict(lower_bound=0.5), "^lower_bound"),
        (dict(lower_bound=float("nan")), "^lower_bound"),
        (dict(lower_bound=True), "^lower_bound"),
        (dict(safe_gate=True), "^lower_bound: safe_gate=True"),
        (dict(safe_gate=True, lower_bound=-6.0), "^lower_bound: safe_gate=True"),
        (dict(use_gate_in_kernel=False, lower_bound=1.0), "^lower_bound"),  # checked anyway
        (dict(A_log=A_log.to("meta")), "^A_log"),
    ]


def test_forward_bad_inputs(setup, no_work):
    ctx, local, kw, _ = setup
    for over, match in _kcp_cases(local, ctx) + _shared_cases(local, kw):
        assert_raises_unmodified(chunk_kda_det_fwd_kcp, _args(local, ctx, kw, over), match)
        assert_raises_unmodified(chunk_kda_det_kcp, _args(local, ctx, kw, over), match)


def test_forward_checks_are_the_single_rank_packages(setup, no_work):
    """Each shared case raises the same ValueError message from the single-rank entry on
    the same tensors (the KCP entry re-implements its checks so that they all run before
    the first collective; this keeps the two in step)."""
    from cake_kda_det_train import chunk_kda_det_fwd

    ctx, local, kw, _ = setup
    for over, _ in _shared_cases(local, kw):
        args = _args(local, ctx, kw, over)
        del args["ctx"]
        msgs = []
        for fn, a in ((chunk_kda_det_fwd_kcp, dict(args, ctx=ctx)), (chunk_kda_det_fwd, args)):
            with pytest.raises(ValueError) as e:
                fn(**a)
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1], over


def test_backward_bad_inputs(setup, no_work):
    ctx, local, _, saved = setup
    do = local[5]
    for d, match in ((do[:, :-1], "^do: expected shape"), (do.double(), "^do: expected dtype"),
                     (do.to(torch.int32), "^do: expected dtype"), (None, "^do: expected a")):
        with pytest.raises(ValueError, match=match):
            chunk_kda_det_bwd_kcp(d, saved, ctx)
    with pytest.raises(ValueError, match="^ctx: expected"):
        chunk_kda_det_bwd_kcp(do, saved, ctx.partition)
    for flag in (0, "yes"):
        with pytest.raises(ValueError, match="^reduce_gate_param_grads"):
            chunk_kda_det_bwd_kcp(do, saved, ctx, reduce_gate_param_grads=flag)
    with pytest.raises(ValueError, match="^do"):
        chunk_kda_det_bwd_kcp(do.to("meta"), saved, ctx)
