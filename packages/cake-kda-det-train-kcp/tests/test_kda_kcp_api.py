"""Package surface: lazy imports, manifest and sibling registry, partition and context
wrappers, byte counts, workspace and saved-set structure, the rank-order sum."""

import importlib

import pytest
import torch
from _kda_kcp_helpers import CHAIN_CU, CHAIN_ROWS, DEV, global_inputs, shard
from cake_core import Mode
from cake_core.kcp import Partition, build_context
from cake_core.testing import assert_imports_without_triton, bitwise_equal
from cake_kda_det_train_kcp import (
    KDADetKCPSavedSet,
    KDADetKCPWorkspace,
    build_context_det_kcp,
    chunk_kda_det_fwd_kcp,
    comm_bytes,
    partition_det_kcp,
)


def test_import_is_lazy():
    assert_imports_without_triton("cake_kda_det_train_kcp", "cake_kda_det_train_kcp.cake_build")


def test_public_names():
    import cake_kda_det_train_kcp as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    assert pkg.chunk_kda_det_kcp.__doc__.startswith("Context-parallel")
    assert pkg.chunk_kda_det_fwd_kcp.__doc__.startswith("Context-parallel")


def test_manifest_and_sibling_registry():
    """The manifest is well formed and machine-readable: the reused sibling (its name,
    import name, version range, the entries called) matches the installed sibling, the
    kernels are the sibling's own, the digest covers this package's modules too."""
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from cake_kda_det_train import __version__ as sib_version
    from cake_kda_det_train import cake_build as sibling
    from cake_kda_det_train_kcp import __version__
    from cake_kda_det_train_kcp.cake_build import FAMILY, MANIFEST, manifest

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert FAMILY["kind"] == "kcp" and FAMILY["mode"] == "det" and check_name(FAMILY["name"]) == []
    assert parse_name(FAMILY["name"]) == {"family": "kda", "mode": "det", "op": "train",
                                          "kind": "kcp"}
    assert FAMILY["version"] == __version__
    assert m["kernels"] == sibling.MANIFEST["kernels"] and m["kernels"]
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    (reuse,) = MANIFEST["reuses"]
    assert reuse["name"] == sibling.FAMILY["name"]
    assert reuse["import_name"] == sibling.FAMILY["import_name"]
    lo, hi = (part.lstrip("<>=") for part in reuse["version_range"].split(","))
    version = tuple(int(x) for x in sib_version.split("."))
    assert tuple(int(x) for x in lo.split(".")) <= version[:len(lo.split("."))]
    assert version[:len(hi.split("."))] < tuple(int(x) for x in hi.split("."))
    mod = importlib.import_module(reuse["import_name"])
    assert all(getattr(mod, e) is not None for e in reuse["entry_points"])
    assert m["source_digest"] != sibling.manifest()["source_digest"]
    assert all(e in FAMILY["entry_points"] for e in ("chunk_kda_det_kcp",
                                                     "chunk_kda_det_fwd_kcp",
                                                     "chunk_kda_det_bwd_kcp"))


def test_pyproject_dependencies_match_the_registry():
    """pyproject.toml pins the sibling with the registry's range, and the version comes
    from __init__.py (plain text checks: no TOML parser on Python 3.10)."""
    from pathlib import Path

    from cake_kda_det_train_kcp.cake_build import REUSES

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    for dep in (f"{REUSES[0]['name']}{REUSES[0]['version_range']}", "cake-core>=", "torch>=",
                "triton>="):
        assert f'"{dep}' in text, dep
    assert 'path = "src/cake_kda_det_train_kcp/__init__.py"' in text
    assert 'name = "cake-kda-det-train-kcp"' in text


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
    with pytest.raises(ValueError, match="^cu_seqlens_global_cpu"):
        partition_det_kcp([], 2, fragments=rows)


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
    states; the gate-parameter sum adds one row of HV + HV * K floats per rank."""
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
            g = comm_bytes(ctx, K, V, HV, gate_grad_floats=HV + HV * K)
            assert g["bwd_sent"] == b["bwd_sent"] + (HV + HV * K) * 4
            assert g["bwd_received"] == b["bwd_received"] + (W - 1) * (HV + HV * K) * 4
            assert g["calls"] == 3 and g["fwd_sent"] == b["fwd_sent"]
    ctx = build_context(three, None, 1, "cpu", exchange="ring", check_group=False)
    b = comm_bytes(ctx, K, V, HV)
    assert b["fwd_sent"] == b["fwd_received"] == HV * K * V * 4 and b["calls"] == 4
    none = build_context(partition_det_kcp([0, 50, 100], 2), None, 0, "cpu", check_group=False)
    assert comm_bytes(none, K, V, HV) == dict(fwd_sent=0, fwd_received=0, bwd_sent=0,
                                                  bwd_received=0, calls=0)


def test_workspace_for_context():
    from cake_kda_det_train import KDADetWorkspace, make_plan

    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    plan = make_plan(16, 32, torch.float32, DEV)
    ws = KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=2)
    assert ws.mode == Mode.DET and isinstance(ws.local, KDADetWorkspace)
    assert ws["fwd_send"].shape == (3, 2, 16, 48)   # three sending fragments, K + V wide
    assert ws["bwd_recv"].shape == (3, 2, 16, 48)   # three receiving fragments
    assert ws.local_p is not None and ws.local_p.plan.head_v_dim == 16  # transition run K x K
    assert ws.local.max_tokens == CHAIN_CU[-1]
    sq = make_plan(16, 16, torch.float32, DEV)
    assert KDADetKCPWorkspace.for_context(sq, ctx, num_v_heads=2).local_p is None
    ring = build_context_det_kcp(p, None, 0, DEV, exchange="ring")
    assert KDADetKCPWorkspace.for_context(plan, ring, num_v_heads=2)["fwd_send"].numel() == 0
    with pytest.raises(ValueError, match="^plan"):
        KDADetKCPWorkspace.for_context(object(), ctx, num_v_heads=2)
    with pytest.raises(ValueError, match="^ctx"):
        KDADetKCPWorkspace.for_context(plan, p, num_v_heads=2)
    with pytest.raises(ValueError, match="^num_v_heads"):
        KDADetKCPWorkspace.for_context(plan, ctx, num_v_heads=0)


def test_saved_set_nesting_roundtrip():
    """tensors() lists the own tensors then every nested single-rank set's; from_tensors
    rebuilds the same structure (what autograd's save_for_backward needs). The nested sets
    hold fp32 copies of the gate parameters, the own ones the caller's."""
    from cake_kda_det_train import KDADetSavedSet

    p = partition_det_kcp(CHAIN_CU, 1, fragments=CHAIN_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV)
    xs, kw = global_inputs(CHAIN_CU[-1], seed=41, kind="gate")
    _, saved = chunk_kda_det_fwd_kcp(*shard(xs, p)[:5], ctx, **kw)
    assert isinstance(saved, KDADetKCPSavedSet) and saved.mode == Mode.DET
    assert [k for k, _ in saved.groups] == ["first", "middle", "last"]
    assert all(isinstance(s, KDADetSavedSet) for s in saved.local)
    assert saved.A_log is kw["A_log"] and saved.dt_bias is kw["dt_bias"]
    assert all(s.A_log.dtype == torch.float32 and bitwise_equal(s.A_log, kw["A_log"])
               for s in saved.local)
    assert saved.P.shape == (1, 1, 16, 16) and saved.P.dtype == torch.float32
    assert saved.use_gate_in_kernel and saved.reduce_gate_param_grads
    flat = saved.tensors()
    assert len(flat) == len(KDADetKCPSavedSet.tensor_names) + 3 * len(
        KDADetSavedSet.tensor_names)
    back = KDADetKCPSavedSet.from_tensors(Mode.DET, flat, saved.meta)
    assert all(a is b for x, y in zip(back.local, saved.local, strict=True)
               for a, b in zip(x.tensors(), y.tensors(), strict=True))
    assert back.groups == saved.groups and back.P is saved.P
    with pytest.raises(ValueError, match="expected"):
        KDADetKCPSavedSet.from_tensors(Mode.DET, flat[:-1], saved.meta)


def test_sum_over_ranks_single_process():
    """Without torch.distributed (W = 1) the rank-order sum is the share itself."""
    from cake_kda_det_train_kcp.exchange import sum_over_ranks

    ctx = build_context_det_kcp(partition_det_kcp([0, 4], 1), None, 0, DEV)
    share = torch.randn(7, device=DEV)
    assert sum_over_ranks(share, ctx) is share
