"""is_supported_nondet, workspace_bytes_nondet and saved_bytes_nondet (issue 45): the det
package's queries with this package's kinds (det plans and workspaces refused, no launch,
no collective)."""

import cake_kda_det_train_kcp.api as kcp_api
import pytest
import torch
from _kda_nd_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_kda_det_train import make_plan
from cake_kda_det_train_kcp import KDADetKCPWorkspace
from cake_kda_nondet_train import make_nondet_plan
from cake_kda_nondet_train_kcp import (
    KDANondetKCPWorkspace,
    build_context_nondet_kcp,
    chunk_kda_nondet_fwd_kcp,
    is_supported_nondet,
    partition_nondet_kcp,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)

_WORK = ("forward_allgather", "forward_ring", "agree_once")


@pytest.fixture(scope="module")
def setup():
    p = partition_nondet_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=3)
    idx = p.global_index(0).to(DEV)
    return ctx, [t[:, idx].contiguous() for t in xs[:5]], kw


def test_is_supported_nondet(setup):
    ctx, local, kw = setup
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    ws = KDANondetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    det_plan = make_plan(16, 16, torch.float32, DEV)
    det_ws = KDADetKCPWorkspace.for_context(det_plan, ctx, num_v_heads=1)
    with no_kernel_launches(kcp_api, *_WORK):
        assert is_supported_nondet(*local, ctx, **kw) == Support(True, "")
        assert is_supported_nondet(*local, ctx, plan=plan, workspace=ws, **kw)
    for over in (dict(plan=det_plan), dict(plan=plan, workspace=det_ws), dict(scale=-1.0),
                 dict(ctx=None), dict(A_log=None, lower_bound=None)):
        args = {**dict(zip(("q", "k", "v", "g", "beta"), local, strict=True)), "ctx": ctx,
                **kw, **over}
        with pytest.raises(ValueError) as e:
            chunk_kda_nondet_fwd_kcp(**args)
        with no_kernel_launches(kcp_api, *_WORK):
            assert is_supported_nondet(**args) == Support(False, str(e.value)), over


@pytest.mark.parametrize("rows, exchange, K, V", [
    (CHAIN_ROWS, "allgather", 16, 16), (CHAIN_ROWS, "allgather", 16, 32),
    (CHAIN_ROWS, "ring", 32, 16), (None, "allgather", 16, 16),
])
def test_workspace_bytes_nondet(rows, exchange, K, V):
    ctx = build_context_nondet_kcp(partition_nondet_kcp(CHAIN_CU, 1, fragments=rows), None, 0,
                                   DEV, exchange=exchange)
    plan = make_nondet_plan(K, V, torch.bfloat16, DEV)
    ws = KDANondetKCPWorkspace.for_context(plan, ctx, num_v_heads=2, dtype=torch.bfloat16)
    got = ws.nbytes + ws.local.nbytes + (ws.local_p.nbytes if ws.local_p is not None else 0)
    assert workspace_bytes_nondet(plan, ctx, num_v_heads=2, dtype=torch.bfloat16) == got
    with pytest.raises(ValueError, match="^plan"):
        workspace_bytes_nondet(make_plan(K, V, torch.bfloat16, DEV), ctx, num_v_heads=2)


@pytest.mark.parametrize("exchange", ["allgather", "ring"])
def test_saved_bytes_nondet(setup, exchange):
    ctx, local, kw = setup
    ctx = build_context_nondet_kcp(ctx.partition, None, 0, DEV, exchange=exchange)
    _, saved = chunk_kda_nondet_fwd_kcp(*local, ctx, **kw)
    tables = [s.cu_seqlens for s in saved.local] + [ctx.cu_seqlens]
    params = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    want = owned_nbytes(saved.tensors(), exclude=(*local, *params, *tables))
    assert saved_bytes_nondet(*local, ctx, **kw) == want
    with pytest.raises(ValueError, match="^plan"):
        saved_bytes_nondet(*local, ctx, plan=make_plan(16, 16, torch.float32, DEV), **kw)
