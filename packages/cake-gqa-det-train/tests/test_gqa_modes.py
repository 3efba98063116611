"""The det entries refuse another mode's or family's plan, saved set and workspace (fake
NONDET objects here: the non-deterministic sibling is tested in its own package); plans
serialise and refuse bad fields."""

import dataclasses
import json
import types

import cake_gqa_det_train.launch as launch
import pytest
import torch
from _gqa_cases import DEV, make
from cake_core import Mode, Plan, SavedSet, Workspace
from cake_core.testing import (
    assert_raises_unmodified,
    assert_same_output_across_processes,
    bitwise_equal,
    no_kernel_launches,
)
from cake_gqa_det_train import (
    HEAD_DIMS,
    GQADetPlan,
    GQADetSavedSet,
    GQADetWorkspace,
    gqa_det,
    gqa_det_bwd,
    gqa_det_fwd,
    make_plan,
)

KERNELS = ("gqa_fwd_kernel", "gqa_bwd_delta_kernel", "gqa_bwd_dkdv_kernel",
           "gqa_bwd_dq_kernel")


@dataclasses.dataclass(frozen=True)
class GQANondetPlan(Plan):
    """A non-det sibling's plan (the shape of cake_gqa_train's, not imported)."""

    family = "cake-gqa-train"
    head_dim: int = 64


class GQANondetSavedSet(SavedSet):
    tensor_names = GQADetSavedSet.tensor_names


class GQANondetWorkspace(Workspace):
    """A non-det sibling's workspace."""


def _case():
    return make(lens_q=[5, 33, 0, 7], lens_k=[9, 33, 4, 7], Hq=4, Hkv=2, D=64, seed=5)


def _args(c):
    return {"q": c["q"], "k": c["k"], "v": c["v"], "cu_seqlens_q": c["cu_q"],
            "cu_seqlens_k": c["cu_k"]}


def _nondet_copy(plan):
    """The plan with mode NONDET (past __post_init__, which refuses it)."""
    p = dataclasses.replace(plan)
    object.__setattr__(p, "mode", Mode.NONDET)
    return p


def _refused(fn, kwargs, msg):
    with no_kernel_launches(launch, *KERNELS):
        assert_raises_unmodified(fn, kwargs, msg)


# ----------------------------------------------------------------------------- plans


def test_det_plan_cannot_be_built_nondet():
    plan = make_plan(64, torch.float32, DEV)
    with pytest.raises(ValueError, match="GQADetPlan: mode must be det, got nondet"):
        GQADetPlan(head_dim=64, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="mode must be det, got nondet"):
        dataclasses.replace(plan, mode=Mode.NONDET)
    with pytest.raises(ValueError, match="mode must be det"):
        GQADetPlan.from_dict(dict(plan.to_dict(), mode="nondet"))
    with pytest.raises(ValueError):  # not a mode at all
        GQADetPlan(head_dim=64, mode="sometimes")


@pytest.mark.parametrize("make_plan_like,msg", [
    (lambda p: _nondet_copy(p), "plan: got GQADetPlan with mode=nondet, expected GQADetPlan "
                                "with mode=det"),
    (lambda p: GQANondetPlan(mode=Mode.NONDET), r"plan: got GQANondetPlan \(mode=nondet\), "
                                                "expected GQADetPlan with mode=det"),
    (lambda p: GQANondetPlan(), r"plan: got GQANondetPlan \(mode=det\)"),
    (lambda p: types.SimpleNamespace(**p.to_dict() | {"mode": Mode.NONDET}),
     r"plan: got SimpleNamespace \(mode=nondet\)"),
    (lambda p: types.SimpleNamespace(**p.to_dict() | {"mode": Mode.DET}),
     r"plan: got SimpleNamespace \(mode=det\)"),
])
def test_gqa_det_refuses_foreign_or_nondet_plan(make_plan_like, msg):
    plan_like = make_plan_like(make_plan(64, torch.float32, DEV))
    c = _case()
    for fn in (gqa_det, gqa_det_fwd):
        _refused(fn, dict(_args(c), plan=plan_like), msg)


def test_plan_fields_checked():
    plan = make_plan(64, torch.float32, DEV)
    bad = {
        "head_dim must be one of": {"head_dim": 96},
        "fwd_block_m must be a power of two >= 16": {"fwd_block_m": 24},
        "dkdv_block_m must be a power of two >= 16": {"dkdv_block_m": 8},
        "dq_block_n must be a power of two >= 16": {"dq_block_n": 0},
        "delta_block_m must be a power of two": {"delta_block_m": 3},
        "fwd_warps must be 1, 2, 4, 8, 16 or 32": {"fwd_warps": 3},
        r"dq_stages must be in \[1, 6\]": {"dq_stages": 7},
        "dkdv_block_n must be an int": {"dkdv_block_n": 32.0},
        "fwd_block_n must be an int": {"fwd_block_n": True},
    }
    for msg, change in bad.items():
        with pytest.raises(ValueError, match=msg):
            dataclasses.replace(plan, **change)


def test_plan_dict_round_trip_and_stable_key():
    for D in HEAD_DIMS:
        for device in ("cpu", "cuda"):  # a rule, not a device query: both build anywhere
            plan = make_plan(D, torch.bfloat16, device)
            d = plan.to_dict()
            assert d["family"] == "cake-gqa-det-train" and d["version"] == 1
            assert d["plan"] == "GQADetPlan" and d["mode"] == "det" and d["head_dim"] == D
            back = GQADetPlan.from_dict(d)
            assert back == plan and hash(back) == hash(plan) and back.key == plan.key
            assert GQADetPlan.from_dict(json.loads(plan.to_json())).to_json() == plan.to_json()
    a, b = make_plan(64, torch.float32, "cpu"), make_plan(64, torch.float16, "cpu")
    # the interpreter's rule: only the element size depends on the dtype
    assert (a.elem_bytes, b.elem_bytes) == (4, 2)
    assert dataclasses.replace(b, elem_bytes=4) == a and a.key != b.key
    assert a.key != make_plan(128, torch.float32, "cpu").key
    assert a.key != dataclasses.replace(a, dkdv_block_m=64).key  # bits depend on it


def test_plan_from_dict_refusals():
    d = make_plan(64, torch.float32, DEV).to_dict()
    with pytest.raises(ValueError, match="format version 2 is not 1"):
        GQADetPlan.from_dict(dict(d, version=2))
    with pytest.raises(ValueError, match="format version 0 is not 1"):
        GQADetPlan.from_dict(dict(d, version=0))
    with pytest.raises(ValueError, match="describes MHCDetPlan, not GQADetPlan"):
        GQADetPlan.from_dict(dict(d, plan="MHCDetPlan"))
    with pytest.raises(ValueError, match=r"unknown GQADetPlan fields \['block_k'\]"):
        GQADetPlan.from_dict(dict(d, block_k=64))
    with pytest.raises(ValueError, match="head_dim must be one of"):
        GQADetPlan.from_dict(dict(d, head_dim=80))


_KEY_SCRIPT = """
import torch
from cake_gqa_det_train.plan import make_plan
print([make_plan(D, torch.bfloat16, dev).key for D in (64, 128, 256) for dev in ("cpu", "cuda")])
"""


def test_plan_key_same_across_processes():
    keys = assert_same_output_across_processes(_KEY_SCRIPT)
    here = [make_plan(D, torch.bfloat16, dev).key for D in (64, 128, 256)
            for dev in ("cpu", "cuda")]
    assert keys == str(here)


@pytest.mark.parametrize("kw,msg", [
    ({"head_dim": 96}, r"head_dim: must be one of \(64, 128, 256\), got 96"),
    ({"head_dim": 32}, "head_dim: must be one of"),
    ({"head_dim": True}, "head_dim: must be one of .*got True"),
    ({"head_dim": 64.5}, "head_dim: must be one of"),
    ({"dtype": torch.int32}, "dtype: expected float32, bfloat16 or float16, got torch.int32"),
    ({"dtype": torch.float64}, "dtype: expected float32, bfloat16 or float16"),
    ({"dtype": "bf16"}, "dtype: expected float32"),
    ({"device": "not-a-device"}, "device: "),
    ({"device": 3.5}, "device: "),
])
def test_make_plan_refusals(kw, msg):
    args = dict({"head_dim": 64, "dtype": torch.bfloat16, "device": DEV}, **kw)
    with pytest.raises(ValueError, match=msg):
        make_plan(**args)


def test_make_plan_rules(monkeypatch):
    """Under the interpreter 32 x 32 tiles (loops cross blocks at the tests' sizes), in any
    dtype; plans are cached and carry the head dim and mode DET. CUDA: Hopper's rule, on
    any GPU (the device's shared memory is pinned to Hopper's: an A100's or a consumer
    GPU's own plans are :func:`test_cuda_rule_fits_the_devices_shared_memory`'s)."""
    import cake_gqa_det_train.plan as gp

    monkeypatch.setattr(gp, "shared_memory", lambda device: gp.HOPPER_SMEM)
    cpu = make_plan(64, torch.float32, "cpu")
    assert (cpu.fwd_block_m, cpu.fwd_block_n, cpu.dkdv_block_m, cpu.dkdv_block_n,
            cpu.dq_block_m, cpu.dq_block_n) == (32,) * 6
    assert make_plan(64, torch.float32, "cpu") is cpu  # cached
    assert dataclasses.replace(make_plan(64, torch.bfloat16, "cpu"), elem_bytes=4) == cpu
    for D in HEAD_DIMS:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            # a second GPU's plan where there is one, or where the rule cannot read any
            two = not torch.cuda.is_available() or torch.cuda.device_count() > 1
            for device in ("cpu", "cuda", *([torch.device("cuda", 1)] if two else [])):
                p = make_plan(D, dtype, device)
                assert p.head_dim == D and p.mode == Mode.DET
                assert p is make_plan(D, dtype, device)
    # D = 256 on CUDA in 16 bits: dK/dV programs of 32 keys stepping 128 query rows, 8 warps
    wide = make_plan(256, torch.bfloat16, "cuda")
    assert (wide.dkdv_block_m, wide.dkdv_block_n, wide.dkdv_warps, wide.dkdv_stages) == \
        (128, 32, 8, 2)


# ----------------------------------------------------------------------------- saved sets


def test_bwd_refuses_foreign_or_nondet_saved_set():
    c = _case()
    out, _, saved = gqa_det_fwd(**_args(c))
    tensors = dict(zip(saved.tensor_names, saved.tensors(), strict=True))
    do = c["do"]
    refusals = {
        r"saved: got GQANondetSavedSet \(mode=nondet\), expected GQADetSavedSet with "
        "mode=det": GQANondetSavedSet(Mode.NONDET, tensors, saved.meta),
        r"saved: got GQANondetSavedSet \(mode=det\)":
            GQANondetSavedSet(Mode.DET, tensors, saved.meta),
        "saved: got GQADetSavedSet with mode=nondet, expected GQADetSavedSet with mode=det":
            GQADetSavedSet(Mode.NONDET, tensors, saved.meta),
        r"saved: got tuple \(mode=none\)": saved.tensors(),
        r"saved: got NoneType": None,
    }
    for msg, s in refusals.items():
        _refused(gqa_det_bwd, {"dout": do, "saved": s}, msg)
    # the saved set's own mode changed after the forward
    saved.mode = Mode.NONDET
    _refused(gqa_det_bwd, {"dout": do, "saved": saved}, "saved: got GQADetSavedSet with "
                                                        "mode=nondet")
    saved.mode = Mode.DET
    dq, dk, dv = gqa_det_bwd(do, saved)
    assert dq.shape == c["q"].shape and dk.shape == c["k"].shape and dv.shape == dk.shape


# ----------------------------------------------------------------------------- workspaces


def _ws_cases(plan):
    T = sum([5, 33, 0, 7])
    nondet_plan = _nondet_copy(plan)
    delta = torch.zeros(4 * T, device=DEV)
    changed_mode = GQADetWorkspace.for_plan(plan, DEV, num_heads=4, max_tokens=T)
    changed_mode.mode = Mode.NONDET
    return {
        "workspace: got GQADetWorkspace with mode=nondet, expected GQADetWorkspace with "
        "mode=det": GQADetWorkspace(nondet_plan, DEV, {"delta": delta}),
        "workspace: got GQADetWorkspace with mode=nondet": changed_mode,
        r"workspace: got GQANondetWorkspace \(mode=nondet\), expected GQADetWorkspace":
            GQANondetWorkspace(GQANondetPlan(mode=Mode.NONDET), DEV, {"delta": delta}),
        r"workspace: got GQANondetWorkspace \(mode=det\)":
            GQANondetWorkspace(plan, DEV, {"delta": delta}),
        r"workspace: got SimpleNamespace \(mode=det\)":
            types.SimpleNamespace(mode=Mode.DET, plan=plan, delta=delta),
        "workspace: GQADetWorkspace was made for plan GQADetPlan:.*the call uses plan":
            GQADetWorkspace.for_plan(make_plan(128, torch.float32, DEV), DEV, 4, T),
        "workspace: GQADetWorkspace was made for plan":
            GQADetWorkspace.for_plan(dataclasses.replace(plan, dq_block_n=2 * plan.dq_block_n),
                                     DEV, 4, T),
        r"workspace: 'delta' must be a contiguous 1-D fp32 tensor of at least 180 values "
        r"\(heads x query tokens\), got float32 \[176\]":
            GQADetWorkspace.for_plan(plan, DEV, num_heads=4, max_tokens=T - 1),
        r"at least 180 values .* got float32 \[135\]":
            GQADetWorkspace.for_plan(plan, DEV, num_heads=3, max_tokens=T),
        r"'delta' must be .*got float64 \[180\]":
            GQADetWorkspace(plan, DEV, {"delta": delta.double()}),
        r"'delta' must be .*got float32 \[4, 45\]":
            GQADetWorkspace(plan, DEV, {"delta": delta.view(4, T)}),
        r"'delta' must be a contiguous": GQADetWorkspace(
            plan, DEV, {"delta": torch.zeros(2 * 4 * T, device=DEV)[::2]}),
        "workspace: buffers are on meta":
            GQADetWorkspace(plan, "meta", {"delta": delta.to("meta")}),
    }


def test_foreign_nondet_or_unfit_workspaces_refused():
    c = _case()
    plan = make_plan(64, torch.float32, DEV)
    for msg, ws in _ws_cases(plan).items():
        _refused(gqa_det, dict(_args(c), plan=plan, workspace=ws), msg)


def test_bwd_refuses_unfit_workspace():
    c = _case()
    plan = make_plan(64, torch.float32, DEV)
    out, _, saved = gqa_det_fwd(**_args(c), plan=plan)
    for msg, ws in _ws_cases(plan).items():
        if isinstance(ws, types.SimpleNamespace):
            continue
        _refused(gqa_det_bwd, {"dout": c["do"], "saved": saved, "workspace": ws}, msg)


def test_workspace_for_plan_refusals():
    plan = make_plan(64, torch.float32, DEV)
    with pytest.raises(ValueError, match="plan: expected GQADetPlan, got object"):
        GQADetWorkspace.for_plan(object(), DEV, 4, 10)
    with pytest.raises(ValueError, match="plan: expected GQADetPlan, got GQANondetPlan"):
        GQADetWorkspace.for_plan(GQANondetPlan(mode=Mode.NONDET), DEV, 4, 10)
    with pytest.raises(ValueError, match="num_heads: expected an int >= 1, got 0"):
        GQADetWorkspace.for_plan(plan, DEV, 0, 10)
    with pytest.raises(ValueError, match="max_tokens: expected an int >= 0, got -1"):
        GQADetWorkspace.for_plan(plan, DEV, 4, -1)
    with pytest.raises(ValueError, match="num_heads: expected an int >= 1, got True"):
        GQADetWorkspace.for_plan(plan, DEV, True, 10)
    ws = GQADetWorkspace.for_plan(plan, DEV, 4, 0)  # zero tokens: an empty buffer
    assert ws["delta"].numel() == 0 and ws.mode == Mode.DET and ws.plan_key == plan.key


def test_workspace_refused_after_its_mode_is_restored_works_again():
    """A workspace whose mode was set to NONDET and back serves a call again, and one
    workspace serves two calls of one plan (nothing carries over)."""
    c = _case()
    plan = make_plan(64, torch.float32, DEV)
    ws = GQADetWorkspace.for_plan(plan, DEV, num_heads=4, max_tokens=64)
    ws.mode = Mode.NONDET
    _refused(gqa_det, dict(_args(c), plan=plan, workspace=ws), "mode=nondet")
    ws.mode = Mode.DET
    grads = []
    for fill in (0.0, float("nan")):
        ws["delta"].fill_(fill)
        q = c["q"].clone().requires_grad_()
        out = gqa_det(q, c["k"], c["v"], c["cu_q"], c["cu_k"], plan=plan, workspace=ws)
        out.backward(c["do"])
        grads.append(q.grad)
    assert torch.isfinite(grads[0]).all() and bitwise_equal(grads[0], grads[1])


def test_workspace_without_delta_buffer_refused_with_value_error():
    c = _case()
    plan = make_plan(64, torch.float32, DEV)
    ws = GQADetWorkspace(plan, DEV, {"scratch": torch.zeros(4 * 45, device=DEV)})
    _refused(gqa_det, dict(_args(c), plan=plan, workspace=ws), "workspace: .*'delta'")


def test_defaults_are_the_cuda_rule_at_head_dim_128():
    from cake_gqa_det_train.plan import _rule

    assert GQADetPlan() == _rule(128, torch.bfloat16, torch.device("cuda"), 232448)


def test_cuda_rule_fits_the_devices_shared_memory(monkeypatch):
    """The CUDA rule reads the device's shared memory per block: Hopper's 227 KiB keeps
    the tiles sized for it; A100's 163 KiB and consumer GPUs' 99 KiB get the smaller tiles
    of ``_SMALLER_16BIT`` (each kernel compiled under the limit offline: gqa.md), a
    different plan for each class (the plan cache keys on it), never larger ones."""
    import cake_gqa_det_train.plan as gp

    cuda = torch.device("cuda", 0)
    plans = {}
    for smem in (gp.HOPPER_SMEM, 262144, gp.A100_SMEM, 200000, gp.SMALL_SMEM, 120000):
        monkeypatch.setattr(gp, "shared_memory", lambda d, s=smem: s)
        for D in HEAD_DIMS:
            plans[smem, D] = make_plan(D, torch.bfloat16, cuda)
    fields = ("fwd_block_m", "fwd_block_n", "fwd_stages", "dkdv_block_m", "dkdv_block_n",
              "dkdv_stages", "dq_block_m", "dq_block_n", "dq_stages")
    for D in HEAD_DIMS:
        hopper = gp._hopper_tiles(D, torch.bfloat16, cuda)
        assert plans[gp.HOPPER_SMEM, D] == plans[262144, D]
        assert plans[gp.HOPPER_SMEM, D] == dataclasses.replace(hopper, elem_bytes=2)
        for cls, between in ((gp.A100_SMEM, 200000), (gp.SMALL_SMEM, 120000)):
            p = plans[cls, D]
            assert p == plans[between, D]  # a class is its least limit
            want = dataclasses.replace(hopper, elem_bytes=2, **gp._SMALLER_16BIT.get((cls, D), {}))
            assert p == want
            for f in fields:  # never a larger tile or more stages than Hopper's
                assert getattr(p, f) <= getattr(hopper, f), (cls, D, f)
    assert plans[gp.A100_SMEM, 128] != plans[gp.HOPPER_SMEM, 128]
    assert plans[gp.SMALL_SMEM, 256] != plans[gp.A100_SMEM, 256]
    assert plans[gp.A100_SMEM, 64] == plans[gp.HOPPER_SMEM, 64]  # fits 163 KiB as it is
