"""is_supported, workspace_bytes and saved_bytes (issue 45): is_supported runs the
forward's checks on this rank only (the entry's messages, no launch, no collective, inputs
unmodified); workspace_bytes is what for_context allocates; saved_bytes is what the
forward's saved set owns beyond the caller's tensors and the context's."""

import cake_causal_conv1d_det_train_kcp.api as kcp_api
import pytest
import torch
import torch.distributed as dist
from _conv_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_causal_conv1d_det_train import make_plan
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPWorkspace,
    build_context_det_kcp,
    causal_conv1d_det_fwd_kcp,
    causal_conv1d_det_kcp,
    is_supported,
    partition_det_kcp,
    saved_bytes,
    workspace_bytes,
)
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from test_conv_kcp_bad_inputs import _args, _cases

_WORK = ("causal_conv1d_det_fwd", "causal_conv1d_det_bwd", "all_gather_bytes", "device_halo",
         "agree_once")


@pytest.fixture(scope="module")
def setup():
    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    return ctx, shard(global_inputs(60, 8, 4, seed=7), p)


@pytest.fixture
def gloo1(tmp_path):
    """A live gloo group of one rank whose collectives raise: an entry's first call
    collects (agree_once), is_supported must not."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)

    def boom(*a, **k):
        raise AssertionError("a collective ran")

    real = {n: getattr(dist, n) for n in ("all_gather", "all_gather_into_tensor",
                                          "all_gather_object", "barrier")}
    for n in real:
        setattr(dist, n, boom)
    try:
        yield
    finally:
        for n, f in real.items():
            setattr(dist, n, f)
        dist.destroy_process_group()


def test_valid_calls_are_supported(setup):
    ctx, (x, w, b, _) = setup
    plan = make_plan(8, 4, torch.float32, DEV, varlen=True)
    ws = CausalConv1dDetKCPWorkspace.for_context(plan, ctx)
    with no_kernel_launches(kcp_api, *_WORK):
        assert is_supported(x, w, b, ctx) == Support(True, "")
        assert is_supported(x, w, None, ctx, activation="silu", reduce_weight_grads=True,
                            plan=plan, workspace=ws)


def test_bad_inputs_give_the_entrys_message(setup):
    ctx, local = setup
    overs = [over for over, _ in _cases(local, ctx)]
    overs += [dict(reduce_weight_grads=1), dict(plan=make_plan(8, 3, torch.float32, DEV))]
    for over in overs:
        args = _args(local, ctx, over)
        with pytest.raises(ValueError) as e:
            causal_conv1d_det_kcp(**args)
        before = {n: t.clone() for n, t in args.items()
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        with no_kernel_launches(kcp_api, *_WORK):
            s = is_supported(**args)
        assert not s and s == Support(False, str(e.value)), (over, s)
        with pytest.raises(ValueError) as e2:
            saved_bytes(**args)
        assert str(e2.value) == str(e.value)
        for n, t in before.items():
            assert torch.equal(args[n], t), n


def test_no_collective(setup, gloo1):
    ctx, (x, w, b, _) = setup
    live = build_context_det_kcp(ctx.partition, None, 0, DEV, 4)
    assert is_supported(x, w, b, live)
    assert is_supported(x, w, b, live, activation="relu").reason.startswith("activation")
    with pytest.raises(AssertionError, match="a collective ran"):  # the entry collects
        causal_conv1d_det_kcp(x, w, b, live)


@pytest.mark.parametrize("rows", [CROSS_ROWS, None])
@pytest.mark.parametrize("dtype, param_dtype, bias", [
    (torch.float32, torch.float32, True), (torch.bfloat16, torch.bfloat16, True),
    (torch.float16, torch.float32, False), (torch.bfloat16, torch.float32, True),
])
def test_saved_and_workspace_bytes(rows, dtype, param_dtype, bias):
    W = 4
    p = partition_det_kcp(CROSS_CU, 1, fragments=rows)
    ctx = build_context_det_kcp(p, None, 0, DEV, W)
    x, w, b, _ = shard(global_inputs(60, 8, W, bias=bias, dtype=dtype, param_dtype=param_dtype,
                                     seed=3), p)
    _, saved = causal_conv1d_det_fwd_kcp(x, w, b, ctx)
    want = owned_nbytes(saved.tensors(), exclude=(x, w, b, ctx.cu_seqlens))
    assert saved_bytes(x, w, b, ctx) == want
    assert want > 0 or (rows is None and param_dtype == torch.float32)  # halo, fp32 copies
    plan = make_plan(8, W, dtype, DEV, varlen=True)
    ws = CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=dtype)
    assert workspace_bytes(plan, ctx, dtype=dtype) == ws.nbytes + ws.local.nbytes
    with pytest.raises(ValueError, match="^ctx: built with conv_kernel_size"):
        workspace_bytes(make_plan(8, 3, dtype, DEV), ctx)


_TWO_RANKS = r"""
import datetime, os, pathlib, sys, time
import torch, torch.distributed as dist
rank, tmp = int(sys.argv[1]), pathlib.Path(sys.argv[2])
dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), 2), rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=60))
from cake_causal_conv1d_det_train_kcp import (build_context_det_kcp, is_supported,
                                              partition_det_kcp)
flag = tmp / "rank0_done"
if rank == 0:  # rank 1 joins no collective until rank 0 has asked: a collective would hang
    from cake_core.triton_utils import default_device
    dev = default_device()  # CPU tensors need the interpreter; a GPU machine runs without it
    torch.set_default_device(dev)
    ctx = build_context_det_kcp(partition_det_kcp([0, 37, 100], 2, "zigzag"), None, 0, dev)
    x, w, b = torch.randn(1, ctx.num_tokens, 8), torch.randn(8, 4), torch.randn(8)
    ok, bad = is_supported(x, w, b, ctx), is_supported(x, w, b, ctx, activation="relu")
    assert ok and not bad and bad.reason.startswith("activation"), (ok, bad)
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
