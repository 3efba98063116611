"""Mode, Plan, Workspace, SavedSet, compile helpers."""

import dataclasses
import json
from typing import ClassVar

import pytest
import torch
from cake_core import Mode, Plan, SavedSet, Workspace, require_mode
from cake_core.compile import plan_from_op_fields, plan_to_op_fields


@dataclasses.dataclass(frozen=True)
class ToyPlan(Plan):
    family: ClassVar[str] = "cake-toy-det-train"
    block: int
    warps: int = 4


class ToySaved(SavedSet):
    tensor_names = ("a", "b")


class OtherSaved(SavedSet):
    tensor_names = ("a",)


def test_mode_strings():
    assert str(Mode.DET) == "det" and Mode("nondet") is Mode.NONDET


def test_require_mode_accepts_and_refuses():
    s = ToySaved(Mode.DET, {"a": torch.ones(1), "b": None})
    require_mode(s, ToySaved, Mode.DET, name="saved")
    with pytest.raises(ValueError, match=r"saved: got OtherSaved \(mode=det\), expected ToySaved"):
        require_mode(OtherSaved(Mode.DET, {"a": None}), ToySaved, name="saved")
    with pytest.raises(ValueError, match="mode=nondet, expected ToySaved with mode=det"):
        require_mode(ToySaved(Mode.NONDET, {"a": None, "b": None}), ToySaved, name="saved")
    with pytest.raises(ValueError, match="got int"):
        require_mode(3, ToySaved)
    old = ToySaved(Mode.DET, {"a": None, "b": None})
    old.version = 0  # as unpickled from an earlier format
    with pytest.raises(ValueError, match="saved: a ToySaved of format version 0, but this "
                                         "version of its package reads version 1"):
        require_mode(old, ToySaved, name="saved")


def test_plan_frozen_hashable_roundtrip():
    p = ToyPlan(block=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.block = 3  # type: ignore[misc]
    assert hash(p) == hash(ToyPlan(block=64)) and p == ToyPlan(block=64)
    d = p.to_dict()
    assert d["plan"] == "ToyPlan" and d["mode"] == "det" and d["family"] == "cake-toy-det-train"
    assert ToyPlan.from_dict(json.loads(json.dumps(d))) == p
    assert p.key == ToyPlan(block=64).key != ToyPlan(block=32).key
    assert p.key.startswith("ToyPlan:")


def test_plan_from_dict_rejects():
    d = ToyPlan(block=64).to_dict()
    with pytest.raises(ValueError, match="unknown"):
        ToyPlan.from_dict({**d, "extra": 1})
    with pytest.raises(ValueError, match="describes"):
        ToyPlan.from_dict({**d, "plan": "OtherPlan"})
    with pytest.raises(ValueError, match="format version"):
        ToyPlan.from_dict({**d, "version": 99})
    with pytest.raises(ValueError, match="must be int"):
        ToyPlan(block=[1])  # type: ignore[arg-type]


def test_plan_op_fields_roundtrip():
    p = ToyPlan(block=64, warps=8)
    assert plan_to_op_fields(p) == [64, 8]
    assert plan_from_op_fields(ToyPlan, [64, 8]) == p
    with pytest.raises(ValueError):
        plan_from_op_fields(ToyPlan, [1])


def test_workspace_checks():
    p = ToyPlan(block=64)
    ws = Workspace(p, "cpu", {"buf": torch.zeros(4, 8)})
    assert ws.nbytes == 4 * 8 * 4 and ws.mode == Mode.DET and ws.plan_key == p.key
    ws.check(p, torch.device("cpu"))
    ws.check(ToyPlan(block=64), torch.device("cpu"))  # an equal plan made anew (no key read)
    with pytest.raises(ValueError, match="was made for plan"):
        ws.check(ToyPlan(block=32), torch.device("cpu"))
    with pytest.raises(ValueError, match="mode"):
        ws.check(ToyPlan(block=64, mode=Mode.NONDET), torch.device("cpu"))
    with pytest.raises(ValueError, match="buffers are on"):
        ws.check(p, torch.device("meta"))
    with pytest.raises(ValueError, match="expected a tensor"):
        Workspace(p, "cpu", {"buf": 3})


def test_saved_set_roundtrip():
    a, b = torch.ones(2), torch.zeros(3)
    s = ToySaved(Mode.DET, {"a": a, "b": b}, meta={"flag": True})
    assert s.a is a and s.flag is True and s.version == 1
    s2 = ToySaved.from_tensors(Mode.DET, s.tensors(), s.meta)
    assert s2.b is b
    with pytest.raises(ValueError, match="missing"):
        ToySaved(Mode.DET, {"a": a})
    with pytest.raises(AttributeError):
        _ = s.nothing


@dataclasses.dataclass(frozen=True)
class CheckedPlan(Plan):
    block: int
    warps: int = 4
    flag: int = 0

    def __post_init__(self):
        super().__post_init__()
        self.require_int_fields()
        self.require_power_of_two("block", minimum=16)
        self.require_warps("warps")
        self.require_flags("flag")
        self.require_mode(Mode.DET)


@pytest.mark.parametrize("kw, msg", [
    ({"block": 16.0}, "block must be an int"),
    ({"block": True}, "block must be an int"),
    ({"block": 8}, "block must be a power of two >= 16"),
    ({"block": 48}, "block must be a power of two >= 16"),
    ({"block": 16, "warps": 3}, "warps must be 1, 2, 4"),
    ({"block": 16, "flag": 2}, "flag must be 0 or 1"),
    ({"block": 16, "mode": Mode.NONDET}, "mode must be det"),
])
def test_plan_field_checks(kw, msg):
    with pytest.raises(ValueError, match=f"CheckedPlan: {msg}"):
        CheckedPlan(**kw)


def test_cached_plan():
    from cake_core.plan import cached_plan

    cache, calls = {}, []
    rule = lambda: calls.append(1) or ToyPlan(block=8)
    assert cached_plan(cache, ("k",), rule) is cached_plan(cache, ("k",), rule)
    assert len(calls) == 1
    from cake_core.plan import MAX_CACHED_PLANS

    for i in range(MAX_CACHED_PLANS + 5):  # e.g. one key per token count
        cached_plan(cache, (i,), rule)
    assert len(cache) <= MAX_CACHED_PLANS
    assert cached_plan(cache, ("k",), rule) == ToyPlan(block=8)  # same answer after a clear


def test_optional_output():
    from cake_core.compile import optional_output

    t, like = torch.ones(2), torch.zeros(3, dtype=torch.bfloat16, device="meta")
    assert optional_output(t, like) is t
    e = optional_output(None, like)
    assert e.shape == (0,) and e.dtype == torch.float32 and e.device.type == "meta"
