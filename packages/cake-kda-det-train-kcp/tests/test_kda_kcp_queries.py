"""is_supported, workspace_bytes and saved_bytes (issue 45): is_supported runs the
forward's checks on this rank only (the entry's messages, no launch, no collective, inputs
unmodified); workspace_bytes is what for_context allocates; saved_bytes what the forward's
saved set owns beyond the caller's tensors and the per-context offsets."""

import dataclasses

import cake_kda_det_train_kcp.api as kcp_api
import pytest
import torch
import torch.distributed as dist
from _kda_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_kda_det_train import make_plan
from cake_kda_det_train_kcp import (
    KDADetKCPWorkspace,
    build_context_det_kcp,
    chunk_kda_det_fwd_kcp,
    is_supported,
    partition_det_kcp,
    saved_bytes,
    workspace_bytes,
)
from test_kda_kcp_bad_inputs import WORK, _args, _kcp_cases, _shared_cases

_WORK = (*WORK, "agree_once")


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=5, kind="gate")
    return ctx, shard(xs, p), kw


@pytest.fixture
def gloo1(tmp_path):
    """A live gloo group of one rank whose collectives raise: an entry's first call
    collects (agree_once), is_supported must not."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)

    def boom(*a, **k):
        raise AssertionError("a collective ran")

    real = {n: getattr(dist, n) for n in ("all_gather", "all_gather_into_tensor",
                                          "all_gather_object", "batch_isend_irecv", "barrier")}
    for n in real:
        setattr(dist, n, boom)
    try:
        yield
    finally:
        for n, f in real.items():
            setattr(dist, n, f)
        dist.destroy_process_group()


def test_valid_calls_are_supported(setup):
    ctx, local, kw = setup
    plan = make_plan(16, 16, torch.float32, DEV)
    ws = KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    ring = build_context_det_kcp(ctx.partition, None, 0, DEV, exchange="ring")
    with no_kernel_launches(kcp_api, *_WORK):
        assert is_supported(*local[:5], ctx, **kw) == Support(True, "")
        assert is_supported(*local[:5], ctx, plan=plan, workspace=ws, **kw)
        assert is_supported(*local[:5], ring)
        assert is_supported(*local[:5], ctx, use_gate_in_kernel=True, lower_bound=-5.0,
                            safe_gate=True, reduce_gate_param_grads=False)


def test_bad_inputs_give_the_entrys_message(setup):
    ctx, local, kw = setup
    cases = _kcp_cases(local, ctx) + _shared_cases(local, kw) + [
        (dict(plan=make_plan(16, 32, torch.float32, DEV)), "^plan"),
    ]
    for over, match in cases:
        args = _args(local, ctx, kw, over)
        with pytest.raises(ValueError, match=match) as e:
            chunk_kda_det_fwd_kcp(**args)
        before = {n: t.clone() for n, t in args.items()
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        with no_kernel_launches(kcp_api, *_WORK):
            s = is_supported(**args)
        assert not s and s == Support(False, str(e.value)), (over, s)
        for n, t in before.items():
            assert torch.equal(args[n], t), n


def test_no_collective(setup, gloo1):
    ctx, local, kw = setup
    live = build_context_det_kcp(ctx.partition, None, 0, DEV)
    assert is_supported(*local[:5], live, **kw)
    assert is_supported(*local[:5], live, scale=0.0).reason.startswith("scale")
    with pytest.raises(AssertionError, match="a collective ran"):  # the entry collects
        chunk_kda_det_fwd_kcp(*local[:5], live, **kw)


@pytest.mark.parametrize("rows, exchange", [
    (CHAIN_ROWS, "allgather"), (CHAIN_ROWS, "ring"), (None, "allgather"),
])
@pytest.mark.parametrize("K, V, HV, dtype", [
    (16, 16, 1, torch.float32), (16, 32, 2, torch.bfloat16), (32, 16, 3, torch.float16),
])
def test_workspace_bytes_is_what_for_context_allocates(rows, exchange, K, V, HV, dtype):
    ctx = build_context_det_kcp(partition_det_kcp(CHAIN_CU, 1, fragments=rows), None, 0, DEV,
                                exchange=exchange)
    plan = make_plan(K, V, dtype, DEV)
    ws = KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=HV, dtype=dtype)
    got = ws.nbytes + ws.local.nbytes + (ws.local_p.nbytes if ws.local_p is not None else 0)
    assert workspace_bytes(plan, ctx, num_v_heads=HV, dtype=dtype) == got
    with pytest.raises(ValueError, match="^num_v_heads"):
        workspace_bytes(plan, ctx, num_v_heads=0)


@pytest.mark.parametrize("cu, rows, exchange", [
    (CHAIN_CU, CHAIN_ROWS, "allgather"), (CHAIN_CU, CHAIN_ROWS, "ring"),
    (CHAIN_CU, None, "allgather"),
    ([0, 30, 34, 38], [(0, 0, 0, 5), (0, 1, 0, 2), (0, 0, 5, 19), (0, 1, 2, 2), (0, 2, 0, 4),
                       (0, 0, 24, 6)], "allgather"),  # "last" of non-adjacent fragments
])
@pytest.mark.parametrize("kind, dtype, param_dtype, strided, keep", [
    ("plain", torch.float32, torch.float32, False, 0),
    ("gate", torch.bfloat16, torch.bfloat16, False, 0),
    ("gate_lb", torch.float16, torch.float32, True, 0),
    ("gate", torch.bfloat16, torch.bfloat16, False, 1),  # plan.keep_states: h, w, kg, v_new
])
def test_saved_bytes_is_what_the_forward_keeps(cu, rows, exchange, kind, dtype, param_dtype,
                                               strided, keep):
    p = partition_det_kcp(cu, 1, fragments=rows)
    ctx = build_context_det_kcp(p, None, 0, DEV, exchange=exchange)
    xs, kw = global_inputs(cu[-1], HV=2, K=16, V=32, dtype=dtype, seed=5, kind=kind)
    kw = {n: t.to(param_dtype) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    if keep:
        kw["plan"] = dataclasses.replace(make_plan(16, 32, dtype, DEV), keep_states=1)
    local = shard(xs, p)[:5]
    if strided:  # a non-contiguous q: the route's contiguous copy
        local[0] = torch.cat([local[0], local[0]], dim=3)[..., ::2]
    _, saved = chunk_kda_det_fwd_kcp(*local, ctx, **kw)
    tables = [s.cu_seqlens for s in saved.local] + [ctx.cu_seqlens]
    params = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    want = owned_nbytes(saved.tensors(), exclude=(*local, *params, *tables))
    assert saved_bytes(*local, ctx, **kw) == want
    with pytest.raises(ValueError, match="^scale"):
        saved_bytes(*local, ctx, scale=-1.0)


_TWO_RANKS = r"""
import datetime, os, pathlib, sys, time
import torch, torch.distributed as dist
rank, tmp = int(sys.argv[1]), pathlib.Path(sys.argv[2])
dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), 2), rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=60))
from cake_kda_det_train_kcp import build_context_det_kcp, is_supported, partition_det_kcp
flag = tmp / "rank0_done"
if rank == 0:  # rank 1 joins no collective until rank 0 has asked: a collective would hang
    from cake_core.triton_utils import default_device
    dev = default_device()  # CPU tensors need the interpreter; a GPU machine runs without it
    torch.set_default_device(dev)
    ctx = build_context_det_kcp(partition_det_kcp([0, 37, 100], 2, "zigzag"), None, 0, dev)
    T = ctx.num_tokens
    q, k, v = (torch.randn(1, T, 1, 16) for _ in range(3))
    g, beta = -torch.rand(1, T, 1, 16), torch.rand(1, T, 1)
    ok, bad = is_supported(q, k, v, g, beta, ctx), is_supported(q, k, v, g, beta, ctx, scale=0)
    assert ok and not bad and bad.reason.startswith("scale"), (ok, bad)
    flag.write_text("ok")
else:
    for _ in range(600):
        if flag.exists():
            break
        time.sleep(0.1)
    assert flag.exists(), "rank 0 did not return from is_supported"
dist.barrier()
dist.destroy_process_group()
print("ok")
"""


def test_no_collective_with_two_ranks(tmp_path):
    """Rank 0 asks on a world-size-2 context while rank 1 joins nothing: returns."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_RANKS, str(r), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip().endswith("ok"), out + err[-3000:]
