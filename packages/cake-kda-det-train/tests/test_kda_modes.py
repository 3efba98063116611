"""Mode and type refusals: a saved set, plan or workspace of another family, type or mode
raises ValueError before any launch (cross-family cases with the real cake-gdn-det-train
objects live in tests-integration/)."""

import dataclasses
from typing import ClassVar

import cake_kda_det_train.api as api
import pytest
import torch
from cake_core import Mode, Plan, SavedSet, Workspace
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetPlan,
    KDADetSavedSet,
    KDADetWorkspace,
    chunk_kda_det,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    make_plan,
)

DEV = default_device()


class GDNLikeSavedSet(SavedSet):
    """A foreign saved set with GDN's tensor names (per-head g)."""

    tensor_names = ("q", "k", "v", "g", "beta", "g_cumsum", "A", "initial_state", "cu_seqlens",
                    "q_rstd", "k_rstd", "A_log", "dt_bias")


@dataclasses.dataclass(frozen=True)
class OtherPlan(Plan):
    family: ClassVar[str] = "cake-other-det-train"
    head_k_dim: int = 16
    head_v_dim: int = 16


class OtherWorkspace(Workspace):
    pass


def _inputs():
    return (randn((1, 10, 1, 16), torch.float32, DEV, seed=1),
            randn((1, 10, 1, 16), torch.float32, DEV, seed=2),
            randn((1, 10, 2, 16), torch.float32, DEV, seed=3),
            -randn((1, 10, 2, 16), torch.float32, DEV, seed=4).abs(),
            randn((1, 10, 2), torch.float32, DEV, seed=5).sigmoid())


@pytest.fixture
def saved_and_do():
    q, k, v, g, beta = _inputs()
    _, _, saved = chunk_kda_det_fwd(q, k, v, g, beta)
    return saved, torch.ones_like(v)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("launched")

    for name in ("_launch_fwd", "_launch_bwd", "kda_chunk_fwd", "kda_chunk_bwd"):
        monkeypatch.setattr(api, name, boom)


def test_foreign_saved_sets_refused(saved_and_do, no_launch):
    saved, do = saved_and_do
    tensors = dict(zip(saved.tensor_names, saved.tensors(), strict=True))
    gdn_like = GDNLikeSavedSet(Mode.DET, tensors, dict(saved.meta))
    with pytest.raises(ValueError, match="saved: got GDNLikeSavedSet .* expected KDADetSavedSet"):
        chunk_kda_det_bwd(do, None, gdn_like)

    class Sub(SavedSet):  # a bare SavedSet subclass, and the base class itself
        tensor_names = ()

    for obj in (Sub(Mode.DET, {}), SavedSet(Mode.DET, {})):
        with pytest.raises(ValueError, match="saved: got"):
            chunk_kda_det_bwd(do, None, obj)
    nondet = KDADetSavedSet(Mode.NONDET, tensors, dict(saved.meta))
    with pytest.raises(ValueError, match="mode=nondet"):
        chunk_kda_det_bwd(do, None, nondet)


def test_plans_of_another_type_or_mode_refused(saved_and_do, no_launch):
    saved, do = saved_and_do
    q, k, v, g, beta = _inputs()
    other = OtherPlan(mode=Mode.DET)
    for fn in (chunk_kda_det_fwd, chunk_kda_det):
        with pytest.raises(ValueError, match="plan: got OtherPlan"):
            fn(q, k, v, g, beta, plan=other)
    with pytest.raises(ValueError, match="plan: got OtherPlan"):
        chunk_kda_det_bwd(do, None, saved, plan=other)
    # a KDADetPlan cannot be built in another mode
    with pytest.raises(ValueError, match="mode"):
        KDADetPlan.from_dict({**make_plan(16, 16, torch.float32, DEV).to_dict(),
                              "mode": "nondet"})
    with pytest.raises(ValueError, match="plan"):
        KDADetWorkspace.for_plan(other, DEV, num_v_heads=2, max_tokens=10)


def test_workspaces_of_another_type_mode_plan_or_dtype_refused(saved_and_do, no_launch):
    saved, do = saved_and_do
    q, k, v, g, beta = _inputs()
    plan = make_plan(16, 16, torch.float32, DEV)
    good = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=10)
    foreign = OtherWorkspace(plan, DEV, {n: good[n] for n in good.names})
    nondet = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=2, max_tokens=10)
    nondet.mode = Mode.NONDET
    other_plan = KDADetWorkspace.for_plan(dataclasses.replace(plan, gate_block_t=16), DEV,
                                          num_v_heads=2, max_tokens=10)
    cases = ((foreign, "workspace: got OtherWorkspace"), (nondet, "mode=nondet"),
             (other_plan, "was made for plan"))
    for ws, msg in cases:
        for fn in (chunk_kda_det_fwd, chunk_kda_det):
            with pytest.raises(ValueError, match=msg):
                fn(q, k, v, g, beta, workspace=ws)
        with pytest.raises(ValueError, match=msg):
            chunk_kda_det_bwd(do, None, saved, workspace=ws)
    # 16-bit intermediates: a workspace built for bf16 inputs does not serve fp32 inputs.
    # K = V = 64: the rule stores 16-bit intermediates from block_k >= 64 on CUDA (>= 32
    # under the interpreter)
    p64 = make_plan(64, 64, torch.float32, DEV)
    assert p64.store_16bit == 1
    bf = KDADetWorkspace.for_plan(p64, DEV, num_v_heads=2, max_tokens=10, dtype=torch.bfloat16)
    assert bf["w"].dtype == torch.bfloat16
    q2 = randn((1, 10, 1, 64), torch.float32, DEV, seed=7)
    v2 = randn((1, 10, 2, 64), torch.float32, DEV, seed=8)
    g2 = -randn((1, 10, 2, 64), torch.float32, DEV, seed=9).abs()
    with pytest.raises(ValueError, match="buffer 'w' must be a contiguous torch.float32"):
        chunk_kda_det_fwd(q2, q2, v2, g2, beta, plan=p64, workspace=bf)


def test_workspace_buffers(saved_and_do):
    """for_plan: the five named buffers, in the intermediates' dtype, sized for the
    capacity; accepted for calls that fit."""
    from cake_kda_det_train.plan import inter_dtype

    # K = 64, V = 128: 16-bit intermediates under either rule (from block_k >= 64 on CUDA,
    # >= 32 under the interpreter), K != V
    plan = make_plan(64, 128, torch.bfloat16, DEV)
    assert plan.store_16bit == 1
    ws = KDADetWorkspace.for_plan(plan, DEV, num_v_heads=3, max_tokens=130, max_seqs=3,
                                  dtype=torch.bfloat16)
    assert ws.mode == Mode.DET and ws.plan_key == plan.key
    assert set(ws.names) == {"w", "u", "v_new", "h", "aqk"}
    assert inter_dtype(plan, torch.bfloat16) == torch.bfloat16
    assert all(ws[n].dtype == torch.bfloat16 for n in ws.names)
    assert ws["w"].shape == (130, 3, 64) and ws["u"].shape == (130, 3, 128)
    assert ws["v_new"].shape == (130, 3, 128) and ws["aqk"].shape == (130, 3, 64)
    assert ws["h"].shape == (4, 3, 64, 128)  # 3 sequences of 130 tokens: at most 4 chunks
    f32 = KDADetWorkspace.for_plan(make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=1,
                                   max_tokens=0)
    assert f32["w"].shape == (0, 1, 16) and f32["h"].shape == (0, 1, 16, 16)
