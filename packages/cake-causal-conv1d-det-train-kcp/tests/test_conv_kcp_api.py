"""Package surface: lazy imports, manifest and sibling registry, partition and context
wrappers, the halo plan against cake_core's halo entries, byte counts, workspace and
saved-set structure."""

import importlib
from pathlib import Path

import pytest
import torch
from _conv_kcp_helpers import CROSS_CU, CROSS_ROWS, DEV, global_inputs, shard
from cake_causal_conv1d_det_train_kcp import (
    CausalConv1dDetKCPSavedSet,
    CausalConv1dDetKCPWorkspace,
    build_context_det_kcp,
    causal_conv1d_det_fwd_kcp,
    comm_bytes,
    partition_det_kcp,
)
from cake_causal_conv1d_det_train_kcp.context import halo_plan, halo_tables
from cake_core import Mode
from cake_core.kcp import Partition, build_context
from cake_core.testing import assert_imports_without_triton


def test_import_is_lazy():
    assert_imports_without_triton("cake_causal_conv1d_det_train_kcp",
                                  "cake_causal_conv1d_det_train_kcp.cake_build",
                                  "cake_causal_conv1d_det_train_kcp.context")


def test_public_names():
    import cake_causal_conv1d_det_train_kcp as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
        assert name == "__version__" or getattr(pkg, name).__doc__, name
    assert pkg.causal_conv1d_det_kcp.__doc__.startswith("Context-parallel")
    assert sorted(dir(pkg)) == sorted(pkg.__all__)


def test_manifest_and_sibling_registry():
    import cake_causal_conv1d_det_train as sibling_pkg
    import cake_causal_conv1d_det_train_kcp as pkg
    from cake_causal_conv1d_det_train import cake_build as sibling
    from cake_causal_conv1d_det_train_kcp.cake_build import FAMILY, MANIFEST, REUSES, manifest
    from cake_core.build import validate_manifest
    from cake_core.naming import check_name, parse_name
    from packaging.specifiers import SpecifierSet

    m = manifest()
    assert validate_manifest(m) == [] and m["source_digest"].startswith("sha256:")
    assert FAMILY["kind"] == "kcp" and check_name(FAMILY["name"]) == []
    assert parse_name(FAMILY["name"]) == {"family": "causal-conv1d", "mode": "det",
                                          "op": "train", "kind": "kcp"}
    assert FAMILY["version"] == pkg.__version__
    assert all(callable(getattr(pkg, e)) for e in FAMILY["entry_points"])
    assert m["kernels"] == sibling.MANIFEST["kernels"] and m["kernels"]
    for k in m["kernels"]:
        assert hasattr(importlib.import_module(k["module"]), k["function"])
    (reuse,) = MANIFEST["reuses"]
    assert reuse is REUSES[0] and reuse["name"] == sibling.FAMILY["name"]
    assert reuse["import_name"] == sibling.FAMILY["import_name"]
    assert sibling_pkg.__version__ in SpecifierSet(reuse["version_range"])
    mod = importlib.import_module(reuse["import_name"])
    assert all(callable(getattr(mod, e)) for e in reuse["entry_points"])
    assert m["source_digest"] != sibling.manifest()["source_digest"]
    # pyproject.toml pins the sibling with the registry's range (read as text: Python 3.10
    # has no tomllib)
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"{reuse["name"]}{reuse["version_range"]}",' in pyproject


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
    ctx = build_context_det_kcp(p, None, 0, DEV, 3)
    assert ctx.rank == 0 and ctx.num_tokens == 9 and ctx.conv_kernel_size == 3
    assert build_context_det_kcp(p, None, 0, DEV).conv_kernel_size == 4
    with pytest.raises(ValueError, match="^partition: expected"):
        build_context_det_kcp(p.to_dict(), None, 0, DEV)
    with pytest.raises(ValueError, match="^partition: made for world_size 2"):
        build_context_det_kcp(partition_det_kcp([0, 5, 9], 2), None, 0, DEV)
    with pytest.raises(ValueError, match="^conv_kernel_size"):
        build_context_det_kcp(p, None, 0, DEV, 0)


PARTITIONS = [
    ([0, 9], 3, "zigzag"), ([0, 1, 17], 4, "zigzag"), ([0, 5, 40, 41, 50], 3, "zigzag"),
    ([0, 2], 3, "contiguous"), ([0, 100], 4, "contiguous"), ([0, 7, 7, 8, 30], 4, "zigzag"),
    ([0, 12], 2, [(0, 0, 0, 4), (1, 0, 4, 1), (0, 0, 5, 1), (1, 0, 6, 1), (0, 0, 7, 5)]),
    ([0, 3, 3, 4, 9, 10, 31], 4, "zigzag"), ([0, 1, 2, 3, 4, 5, 6], 3, "contiguous"),
    (CROSS_CU, 1, CROSS_ROWS),
]


@pytest.mark.parametrize("case", PARTITIONS, ids=range(len(PARTITIONS)))
@pytest.mark.parametrize("wc", [2, 3, 4, 8])
def test_halo_plan_moves_the_right_rows(case, wc):
    """Simulated on token ids: the forward send rows, all-gather and fills give every
    halo slot the global token cake_core's HaloEntry names (zero before a document
    start), and the backward sends every filled slot's gradient back to exactly the
    token it came from, each token's contributions in document order."""
    cu, W, layout = case
    p = (partition_det_kcp(cu, W, layout) if isinstance(layout, str)
         else partition_det_kcp(cu, W, fragments=layout))
    hp = halo_plan(p, wc)
    halos, sends = halo_tables(p, wc)
    h = wc - 1
    ids = [p.global_index(r) for r in range(W)]
    sf, sb = hp.fwd_rows_per_rank, hp.bwd_rows_per_rank
    gathered = torch.full((W * sf,), -1, dtype=torch.int64)
    for r, rh in enumerate(hp.ranks):
        assert len(rh.send_rows) <= sf
        gathered[r * sf:r * sf + len(rh.send_rows)] = ids[r][list(rh.send_rows)]
    published = torch.full((W * sb,), -1, dtype=torch.int64)  # slot ids: (rank, slot)
    slot_tok = {}
    for r, rh in enumerate(hp.ranks):
        ctx = build_context(p, None, r, "cpu", wc, check_group=False)
        assert (halos[r], sends[r]) == (ctx.halo, ctx.halo_send)  # cake_core's, in one pass
        assert rh.has_halo == bool(ctx.halo)
        slots = torch.full((rh.n_slots,), -1, dtype=torch.int64)
        for s, row in rh.fill_self:
            slots[s] = ids[r][row]
        for s, row in rh.fill_recv:
            slots[s] = gathered[row]
        for e in ctx.halo:
            f = ctx.fragments[e.fragment]
            want = [f.global_offset - h + j if j >= h - e.num_tokens else -1 for j in range(h)]
            assert slots[e.fragment * h:(e.fragment + 1) * h].tolist() == want
        for s, tok in enumerate(slots.tolist()):
            if tok >= 0:
                slot_tok[(r, s)] = tok
        assert len(rh.publish) <= sb
        for k, s in enumerate(rh.publish):
            published[r * sb + k] = r * 10**6 + s
    # backward: each filled slot's gradient goes to its token once, in document order
    seen = {}
    for r, rh in enumerate(hp.ranks):
        for rnd in rh.rounds:
            assert len({i for i, _ in rnd}) == len(rnd)  # a row once per round
        for k, rnd in enumerate(rh.rounds):
            for i, pool in rnd:
                tok = int(ids[r][rh.touched[i]])
                if pool < rh.n_slots:
                    src = (r, pool)
                else:
                    code = int(published[pool - rh.n_slots])
                    src = (code // 10**6, code % 10**6)
                assert slot_tok[src] == tok, (src, tok)
                seen.setdefault(tok, []).append((k, src))
    assert sorted(s for v in seen.values() for _, s in v) == sorted(slot_tok)
    starts = {r: [f.global_offset for f in p.fragments(r)] for r in range(W)}
    for v in seen.values():
        order = [starts[src[0]][src[1] // h] for _, src in sorted(v)]
        assert order == sorted(order) and [k for k, _ in sorted(v)] == list(range(len(v)))


def test_comm_bytes():
    """The halo rows (padded to the widest rank) forward and back; the backward also
    carries the fp32 weight-gradient shares when they are reduced."""
    D, b = 16, 2
    p = partition_det_kcp([0, 100], 4)            # one document over four ranks
    for r in range(4):
        ctx = build_context(p, None, r, "cpu", 4, check_group=False)
        e = comm_bytes(ctx, D, torch.bfloat16)
        assert e["fwd_sent"] == 3 * D * b and e["fwd_received"] == 3 * e["fwd_sent"]
        assert e["bwd_sent"] == 3 * D * b and e["calls"] == 2
        assert e["halo_rows_out"] == (3 if r < 3 else 0)
        assert e["halo_rows_in"] == (3 if r > 0 else 0)
        red = comm_bytes(ctx, D, torch.bfloat16, bias=True, reduce_weight_grads=True)
        assert red["bwd_sent"] == 4 * (D * 4 + D) + 3 * D * b and red["fwd_sent"] == 96
    none = build_context(partition_det_kcp([0, 50, 100], 2), None, 0, "cpu", 4,
                         check_group=False)
    assert comm_bytes(none, D) == dict(fwd_sent=0, fwd_received=0, bwd_sent=0,
                                           bwd_received=0, calls=0, halo_rows_out=0,
                                           halo_rows_in=0)
    red = comm_bytes(none, 3, reduce_weight_grads=True)
    assert red["bwd_sent"] == 48 and red["calls"] == 1   # 4 * 3 * 4 bytes, padded to 8
    one = build_context(partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS), None, 0, "cpu",
                        4, check_group=False)
    assert comm_bytes(one, D, reduce_weight_grads=True)["calls"] == 0


def test_workspace_for_context():
    from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace, make_plan

    p = partition_det_kcp([0, 100], 4)
    ctx = build_context(p, None, 1, DEV, 4, check_group=False)
    plan = make_plan(16, 4, torch.float32, DEV)
    ws = CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=torch.bfloat16)
    assert ws.mode == Mode.DET and isinstance(ws.local, CausalConv1dDetWorkspace)
    assert ws["fwd_send"].shape == (3 * 16 * 2,) and ws["fwd_recv"].shape == (4, 96)
    assert ws["bwd_send"].shape == (4 * (16 * 4 + 16) + 96,)
    assert ws["bwd_recv"].shape == (4, 4 * (16 * 4 + 16) + 96)
    assert ws.bytes_view("bwd_recv", 10).shape == (4, 10)
    assert ws.bytes_view("bwd_recv", 10).data_ptr() == ws["bwd_recv"].data_ptr()
    one = build_context_det_kcp(partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS), None,
                                0, DEV, 4)
    ws1 = CausalConv1dDetKCPWorkspace.for_context(make_plan(16, 4, torch.float32, DEV), one)
    assert all(ws1[n].numel() == 0 for n in ws1.names)   # W = 1: no collective
    with pytest.raises(ValueError, match="^plan"):
        CausalConv1dDetKCPWorkspace.for_context(object(), ctx)
    with pytest.raises(ValueError, match="^ctx: expected"):
        CausalConv1dDetKCPWorkspace.for_context(plan, p)
    with pytest.raises(ValueError, match="^ctx: built with conv_kernel_size=4"):
        CausalConv1dDetKCPWorkspace.for_context(make_plan(16, 3, torch.float32, DEV), ctx)
    with pytest.raises(ValueError, match="^dtype"):
        CausalConv1dDetKCPWorkspace.for_context(plan, ctx, dtype=torch.float64)


def test_saved_set_nesting_roundtrip():
    """tensors() lists the own tensors then the nested single-rank set's; from_tensors
    rebuilds the same structure (what autograd's save_for_backward needs). The nested set
    holds the halo as its initial_state and an fp32 weight for a 16-bit one."""
    from cake_causal_conv1d_det_train import CausalConv1dDetSavedSet

    p = partition_det_kcp(CROSS_CU, 1, fragments=CROSS_ROWS)
    ctx = build_context_det_kcp(p, None, 0, DEV, 4)
    x, w, b, _ = shard(global_inputs(60, 8, 4, dtype=torch.bfloat16), p)
    _, saved = causal_conv1d_det_fwd_kcp(x, w, b, ctx, activation="swish")
    assert isinstance(saved, CausalConv1dDetKCPSavedSet) and saved.mode == Mode.DET
    assert isinstance(saved.local, CausalConv1dDetSavedSet)
    assert saved.activation == "silu" and saved.kernel_size == 4
    assert saved.local.initial_state.shape == (ctx.num_fragments, 8, 3)
    assert saved.local.weight.dtype == torch.float32 and saved.weight is w
    flat = saved.tensors()
    assert len(flat) == 3 + len(CausalConv1dDetSavedSet.tensor_names)
    back = CausalConv1dDetKCPSavedSet.from_tensors(Mode.DET, flat, saved.meta)
    assert all(a is b for a, b in zip(back.local.tensors(), saved.local.tensors(), strict=True))
    assert back.x is saved.x and back.plan == saved.plan
    with pytest.raises(ValueError, match="expected"):
        CausalConv1dDetKCPSavedSet.from_tensors(Mode.DET, flat[:-1], saved.meta)
