"""cake_core.kcp_state: the nested saved set and the workspace of the state-exchange ``-kcp``
families, with stand-in single-rank types (the families' own suites run them, and the
routes of cake_core.kcp_route, for real)."""

import dataclasses

import pytest
import torch
from cake_core import Mode, Plan, SavedSet, Workspace
from cake_core.kcp import Partition, build_context
from cake_core.kcp_state import KCPStateSavedSet, KCPStateWorkspace
from cake_core.testing import assert_imports_without_triton


class _LocalSaved(SavedSet):
    tensor_names = ("a", "b")


class _Saved(KCPStateSavedSet):
    tensor_names = ("q", "P")
    local_type = _LocalSaved


@dataclasses.dataclass(frozen=True)
class _Plan(Plan):
    head_k_dim: int = 4
    head_v_dim: int = 4


class _LocalWs(Workspace):
    @classmethod
    def for_plan(cls, plan, device, *, num_v_heads, max_tokens, max_seqs, dtype):
        ws = cls(plan, device, {})
        ws.sizes = (num_v_heads, max_tokens, max_seqs, dtype)
        return ws


class _Ws(KCPStateWorkspace):
    plan_type = _Plan
    local_type = _LocalWs
    transition_plan = staticmethod(lambda plan, dtype, device: (
        plan if plan.head_v_dim == plan.head_k_dim else _Plan(plan.head_k_dim,
                                                              plan.head_k_dim)))


def test_import_does_not_import_triton():
    assert_imports_without_triton("cake_core.kcp_state", "cake_core.kcp_exchange",
                                  "cake_core.kcp_route")


def test_nested_saved_set_round_trip():
    t = [torch.full((1,), float(i)) for i in range(6)]
    local = (_LocalSaved(Mode.DET, {"a": t[2], "b": t[3]}, {"i": 0}),
             _LocalSaved(Mode.DET, {"a": t[4], "b": None}, {"i": 1}))
    s = _Saved(Mode.DET, {"q": t[0], "P": None}, {"groups": ("x", "y")}, local)
    assert s.meta["local_meta"] == ({"i": 0}, {"i": 1})
    flat = s.tensors()
    assert len(flat) == 6 and flat[0] is t[0] and flat[1] is None and flat[4] is t[4]
    r = _Saved.from_tensors(Mode.DET, flat, s.meta)
    assert [x.meta for x in r.local] == [{"i": 0}, {"i": 1}] and r.local[1].a is t[4]
    assert type(r.local[0]) is _LocalSaved and r.q is t[0] and r.P is None
    with pytest.raises(ValueError, match="^_Saved: expected 6 tensors, got 5"):
        _Saved.from_tensors(Mode.DET, flat[:5], s.meta)
    with pytest.raises(ValueError, match="^_Saved: 1 nested saved sets for 2 groups"):
        _Saved(Mode.DET, {"q": t[0], "P": None}, {"groups": ("x", "y")}, local[:1])


def test_workspace_for_context_and_check_for():
    p = Partition.from_cu_seqlens([0, 12], 1)
    ctx = build_context(p, None, 0, "cpu")
    plan = _Plan(4, 6)
    ws = _Ws.for_context(plan, ctx, num_v_heads=2, dtype=torch.bfloat16)
    assert ws["fwd_send"].shape == (0, 2, 4, 6) and ws.local.sizes == (2, 12, 1, torch.bfloat16)
    assert ws.local_p is None and ws.num_v_heads == 2
    ws.check_for(plan, ctx, 2, torch.bfloat16)
    with pytest.raises(ValueError, match=r"_Ws\.for_context\(plan, ctx, num_v_heads=HV"):
        ws.check_for(plan, ctx, 3, torch.bfloat16)
    with pytest.raises(ValueError, match="^plan: expected _Plan, got str"):
        _Ws.for_context("plan", ctx, num_v_heads=2)
    with pytest.raises(ValueError, match="^ctx: expected a cake_core.kcp.Context, got"):
        _Ws.for_context(plan, p, num_v_heads=2)
    with pytest.raises(ValueError, match="^num_v_heads"):
        _Ws.for_context(plan, ctx, num_v_heads=0)
    # three ranks over one document: rank 1's fragment is a middle one (K + V rows, P plan)
    p3 = Partition.from_cu_seqlens([0, 12], 3)
    c1 = build_context(p3, None, 1, "cpu", check_group=False)
    ws = _Ws.for_context(plan, c1, num_v_heads=2)
    assert ws["fwd_recv"].shape[-1] == 10 and ws["fwd_recv"].shape[0] == 3 * ws[
        "fwd_send"].shape[0]
    assert ws.local_p is not None and ws.local_p.plan == _Plan(4, 4)
    assert ws.local_p.sizes[1:3] == (4, 1)
