"""is_supported_nondet, workspace_bytes_nondet and saved_bytes_nondet (issue 45): the det
package's queries with this package's types (det plans and workspaces refused, no launch,
no collective)."""

import cake_gdn_det_train_kcp.api as kcp_api
import pytest
import torch
from _gdn_nd_kcp_helpers import DEV, global_inputs
from cake_core.support import Support, owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_gdn_det_train import make_plan
from cake_gdn_det_train_kcp import GDNDetKCPWorkspace
from cake_gdn_nondet_train import make_nondet_plan
from cake_gdn_nondet_train_kcp import (
    GDNNondetKCPWorkspace,
    build_context_nondet_kcp,
    chunk_gdn_nondet_fwd_kcp,
    is_supported_nondet,
    partition_nondet_kcp,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)

CU = [0, 70, 85, 100]
ROWS = [(0, 0, 0, 30), (0, 1, 0, 10), (0, 0, 30, 20), (0, 1, 10, 5), (0, 0, 50, 20),
        (0, 2, 0, 15)]


@pytest.fixture(scope="module")
def setup():
    p = partition_nondet_kcp(CU, 1, fragments=ROWS)
    ctx = build_context_nondet_kcp(p, None, 0, DEV)
    xs = global_inputs(100, seed=3)
    idx = p.global_index(0).to(DEV)
    return ctx, [t[:, idx].contiguous() for t in xs[:5]]


def test_is_supported_nondet(setup, monkeypatch):
    ctx, local = setup
    plan = make_nondet_plan(16, 16, torch.float32, DEV)
    ws = GDNNondetKCPWorkspace.for_context(plan, ctx, num_v_heads=1)
    det_plan = make_plan(16, 16, torch.float32, DEV)
    det_ws = GDNDetKCPWorkspace.for_context(det_plan, ctx, num_v_heads=1)

    def boom(*a, **k):
        raise AssertionError("a collective ran")

    monkeypatch.setattr(kcp_api, "agree_once", boom)
    with no_kernel_launches(kcp_api, "forward_allgather", "forward_ring"):
        assert is_supported_nondet(*local, ctx) == Support(True, "")
        assert is_supported_nondet(*local, ctx, plan=plan, workspace=ws)
    monkeypatch.undo()
    for over in (dict(plan=det_plan), dict(plan=plan, workspace=det_ws), dict(scale=-1.0),
                 dict(ctx=None)):
        args = {**dict(zip(("q", "k", "v", "g", "beta"), local, strict=True)), "ctx": ctx, **over}
        with pytest.raises(ValueError) as e:
            chunk_gdn_nondet_fwd_kcp(**args)
        with no_kernel_launches(kcp_api, "forward_allgather", "forward_ring", "agree_once"):
            assert is_supported_nondet(**args) == Support(False, str(e.value)), over


@pytest.mark.parametrize("rows, exchange, K, V", [
    (ROWS, "allgather", 16, 16), (ROWS, "allgather", 16, 32), (ROWS, "ring", 32, 16),
    (None, "allgather", 16, 16),
])
def test_workspace_bytes_nondet(rows, exchange, K, V):
    ctx = build_context_nondet_kcp(partition_nondet_kcp(CU, 1, fragments=rows), None, 0, DEV,
                                   exchange=exchange)
    plan = make_nondet_plan(K, V, torch.bfloat16, DEV)
    ws = GDNNondetKCPWorkspace.for_context(plan, ctx, num_v_heads=2, dtype=torch.bfloat16)
    got = ws.nbytes + ws.local.nbytes + (ws.local_p.nbytes if ws.local_p is not None else 0)
    assert workspace_bytes_nondet(plan, ctx, num_v_heads=2, dtype=torch.bfloat16) == got
    with pytest.raises(ValueError, match="^plan"):
        workspace_bytes_nondet(make_plan(K, V, torch.bfloat16, DEV), ctx, num_v_heads=2)


@pytest.mark.parametrize("exchange", ["allgather", "ring"])
def test_saved_bytes_nondet(setup, exchange):
    ctx, local = setup
    ctx = build_context_nondet_kcp(ctx.partition, None, 0, DEV, exchange=exchange)
    _, saved = chunk_gdn_nondet_fwd_kcp(*local, ctx, use_qk_l2norm_in_kernel=True)
    tables = [s.cu_seqlens for s in saved.local] + [ctx.cu_seqlens]
    want = owned_nbytes(saved.tensors(), exclude=(*local, *tables))
    assert saved_bytes_nondet(*local, ctx, use_qk_l2norm_in_kernel=True) == want
    with pytest.raises(ValueError, match="^plan"):
        saved_bytes_nondet(*local, ctx, plan=make_plan(16, 16, torch.float32, DEV))
