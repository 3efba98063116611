"""Package surface: lazy imports, manifest, partition and context wrappers, byte counts,
workspace and saved-set structure."""

import importlib

import pytest
import torch
from _gdn_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_core import Mode
from cake_core.kcp import Partition, build_context
from cake_core.testing import assert_imports_without_triton
from cake_gdn_det_train_kcp import (
    GDNDetKCPSavedSet,
    GDNDetKCPWorkspace,
    build_context_det_kcp,
    chunk_gdn_det_fwd_kcp,
    comm_bytes,
    partition_det_kcp,
)


def test_import_is_lazy():
    assert_imports_without_triton("cake_gdn_det_train_kcp", "cake_gdn_det_train_kcp.cake_build")


def test_public_names():
    import cake_gdn_det_train_kcp as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert pkg.chunk_gated_delta_rule_det_kcp.__doc__.startswith("Context-parallel")


def test_manifest_and_sibling_registry():
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from cake_gdn_det_train import cake_build as sibling
    from cake_gdn_det_train_kcp.cake_build import FAMILY, MANIFEST, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert FAMILY["kind"] == "kcp" and check_name(FAMILY["name"]) == []
    assert parse_name(FAMILY["name"])["kind"] == "kcp"
    assert m["kernels"] == sibling.MANIFEST["kernels"] and m["kernels"]
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    (reuse,) = MANIFEST["reuses"]
    assert reuse["name"] == sibling.FAMILY["name"]
    mod = importlib.import_module(reuse["import_name"])
    assert all(callable(getattr(mod, e)) for e in reuse["entry_points"])
    assert m["source_digest"] != sibling.manifest()["source_digest"]


def test_partition_wrapper():
    cu = torch.tensor([0, 3, 10, 10, 16])
    for layout in ("contiguous", "zigzag"):
        assert partition_det_kcp(cu, 3, layout) == Partition.from_cu_seqlens(cu, 3, layout)
    rows = [(1, 0, 0, 3), (0, 1, 0, 7), (1, 3, 0, 6)]
    p = partition_det_kcp(cu, 2, fragments=rows)
    assert p == Partition.from_fragments(rows, 2, 16, cu_seqlens=cu) and p.layout == "explicit"
    assert partition_det_kcp([0, 3, 10, 10, 16], 2, fragments=rows) == p
    with pytest.raises(ValueError, match="^layout"):
        partition_det_kcp(cu, 2, "zigzag", fragments=rows)
    with pytest.raises(ValueError, match="^layout"):
        partition_det_kcp(cu, 2, "diagonal")
    with pytest.raises(ValueError, match="^world_size"):
        partition_det_kcp(cu, 0)
    with pytest.raises(ValueError, match="fragments do not cover"):
        partition_det_kcp(cu, 2, fragments=rows[:2])
    with pytest.raises(ValueError, match="^cu_seqlens"):
        partition_det_kcp([0, 5, 3], 2)


def test_context_wrapper():
    p = partition_det_kcp([0, 5, 9], 1)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    assert ctx.rank == 0 and ctx.num_tokens == 9 and ctx.exchange == "allgather"
    assert build_context_det_kcp(p, None, 0, DEV, exchange="ring").exchange == "ring"
    with pytest.raises(ValueError, match="^partition: expected"):
        build_context_det_kcp(p.to_dict(), None, 0, DEV)
    with pytest.raises(ValueError, match="^partition: made for world_size 2"):
        build_context_det_kcp(partition_det_kcp([0, 5, 9], 2), None, 0, DEV)
    with pytest.raises(ValueError, match="^exchange"):
        build_context_det_kcp(p, None, 0, DEV, exchange="tree")


def test_comm_bytes():
    """All-gather rows are V wide without middle fragments, K + V with; the ring moves
    states."""
    K, V, HV = 16, 32, 2
    row = HV * K * 4
    two = partition_det_kcp([0, 100], 2)          # one document over two ranks
    three = partition_det_kcp([0, 100], 3)        # a middle fragment on rank 1
    for p, wd in ((two, V), (three, K + V)):
        W = p.world_size
        for r in range(W):
            ctx = build_context(p, None, r, "cpu", check_group=False)
            b = comm_bytes(ctx, K, V, HV)
            assert b["fwd_sent"] == row * wd and b["fwd_received"] == (W - 1) * row * wd
            assert b["bwd_sent"] == b["fwd_sent"] and b["calls"] == 2
    ctx = build_context(three, None, 1, "cpu", exchange="ring", check_group=False)
    b = comm_bytes(ctx, K, V, HV)
    assert b["fwd_sent"] == b["fwd_received"] == HV * K * V * 4 and b["calls"] == 4
    none = build_context(partition_det_kcp([0, 50, 100], 2), None, 0, "cpu", check_group=False)
    assert comm_bytes(none, K, V, HV) == dict(fwd_sent=0, fwd_received=0, bwd_sent=0,
                                                  bwd_received=0, calls=0)


def test_workspace_for_context():
    from cake_gdn_det_train import GDNDetWorkspace, make_plan

    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    plan = make_plan(16, 32, torch.float32, DEV)
    ws = GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=2)
    assert ws.mode == Mode.DET and isinstance(ws.local, GDNDetWorkspace)
    assert ws["fwd_send"].shape == (3, 2, 16, 48)   # three sending fragments, K + V wide
    assert ws["bwd_recv"].shape == (3, 2, 16, 48)   # three receiving fragments
    assert ws.local_p is not None and ws.local_p.plan.head_v_dim == 16  # transition run K x K
    assert ws.local.max_tokens == 100
    sq = make_plan(16, 16, torch.float32, DEV)
    assert GDNDetKCPWorkspace.for_context(sq, ctx, num_v_heads=2).local_p is None
    ring = build_context_det_kcp(p, None, 0, DEV, exchange="ring")
    assert GDNDetKCPWorkspace.for_context(plan, ring, num_v_heads=2)["fwd_send"].numel() == 0
    with pytest.raises(ValueError, match="^plan"):
        GDNDetKCPWorkspace.for_context(object(), ctx, num_v_heads=2)
    with pytest.raises(ValueError, match="^num_v_heads"):
        GDNDetKCPWorkspace.for_context(plan, ctx, num_v_heads=0)


def test_saved_set_nesting_roundtrip():
    """tensors() lists the own tensors then every nested single-rank set's; from_tensors
    rebuilds the same structure (what autograd's save_for_backward needs)."""
    from cake_gdn_det_train import GDNDetSavedSet

    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    local = shard(global_inputs(100), p)
    _, saved = chunk_gdn_det_fwd_kcp(*local[:5], ctx)
    assert isinstance(saved, GDNDetKCPSavedSet) and saved.mode == Mode.DET
    assert [k for k, _ in saved.groups] == ["first", "alone", "middle", "last"]
    assert all(isinstance(s, GDNDetSavedSet) for s in saved.local)
    assert saved.P.shape == (1, 1, 16, 16) and saved.P.dtype == torch.float32
    flat = saved.tensors()
    assert len(flat) == len(GDNDetKCPSavedSet.tensor_names) + 4 * len(
        GDNDetSavedSet.tensor_names)
    back = GDNDetKCPSavedSet.from_tensors(Mode.DET, flat, saved.meta)
    assert all(a is b for x, y in zip(back.local, saved.local, strict=True)
               for a, b in zip(x.tensors(), y.tensors(), strict=True))
    assert back.groups == saved.groups and back.P is saved.P
    with pytest.raises(ValueError, match="expected"):
        GDNDetKCPSavedSet.from_tensors(Mode.DET, flat[:-1], saved.meta)
