"""is_supported / workspace_bytes / saved_bytes of the grouped GEMM entry agree with its
checks and with what for_plan and the forward allocate."""

import dataclasses

import cake_moe_grouped_det_gemm.api as api
import pytest
import torch
from _moe_cases import DEV, make, offs_of
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches
from cake_moe_grouped_det_gemm import (
    MoEGroupedDetWorkspace,
    is_supported,
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_det_gemm_fwd,
    saved_bytes,
    workspace_bytes,
)
from test_moe_bad_inputs import CASES, VALUE_CASES, base

LAUNCHES = ("_launch_fwd", "_launch_bwd", "_grouped_mm", "_launch_wgrad")


@pytest.mark.parametrize("M,E,N,K", [(1, 1, 1, 1), (37, 3, 5, 7), (0, 4, 8, 16),
                                     (4096, 8, 512, 1024), (100, 64, 24, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 1, 2, 5])
def test_workspace_bytes_matches_for_plan(M, E, N, K, dtype, splits):
    plan = make_plan(M, E, N, K, dtype, DEV)
    if splits is not None:
        plan = dataclasses.replace(plan, wgrad_splits=splits)
    assert workspace_bytes(plan) == workspace_bytes(plan, DEV) == \
        MoEGroupedDetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_refuses_as_for_plan():
    with pytest.raises(ValueError) as e:
        MoEGroupedDetWorkspace.for_plan("plan", DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes("plan")
    assert str(e.value) == str(e2.value)
    with pytest.raises(ValueError, match="device"):
        workspace_bytes(make_plan(4, 2, 4, 4, torch.float32, DEV), device="nowhere")


@pytest.mark.parametrize("sizes,tail", [([3, 0, 5], 0), ([1], 2), ([0, 0], 0), ([4, 1, 0, 2], 3)])
@pytest.mark.parametrize("by", ["offs", "m_sizes"])
def test_saved_bytes_matches_forward(sizes, tail, by):
    x, w, offs, _ = make(sizes, N=8, K=16, tail=tail)
    kw = {"offs": offs} if by == "offs" else \
        {"m_sizes": torch.tensor(sizes, dtype=torch.int32, device=DEV)}
    _, saved = moe_grouped_det_gemm_fwd(x, w, **kw)
    inputs = [x, w, *kw.values()]
    assert saved_bytes(x, w, **kw) == owned_nbytes(saved.tensors(), exclude=inputs) == \
        4 * len(sizes)
    meta = {k: v.to("meta") for k, v in kw.items()}
    assert saved_bytes(x.to("meta"), w.to("meta"), **meta) == 4 * len(sizes)


def test_is_supported_true_and_launches_nothing():
    x, w, offs, _ = make([3, 0, 5], N=8, K=16)
    plan = make_plan(8, 3, 8, 16, torch.float32, DEV)
    ws = MoEGroupedDetWorkspace.for_plan(plan, DEV)
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(x, w, offs, plan=plan, workspace=ws)
        assert s and s.reason == ""
        assert is_supported(x, w, m_sizes=torch.tensor([3, 0, 5], dtype=torch.int32,
                                                        device=DEV))
    assert bitwise_equal(offs, offs_of([3, 0, 5]))


@pytest.mark.parametrize("case", list(CASES))
def test_is_supported_false_with_the_entrys_message(case):
    if case in VALUE_CASES and DEV.type != "cpu":
        pytest.skip("offs / m_sizes values on a GPU are not read by the host (no sync)")
    make_kw, _ = CASES[case]
    kw = make_kw(base())
    keep = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)
            and v.device.type != "meta"}
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(**kw)
        with pytest.raises(ValueError) as e:
            moe_grouped_det_gemm(**kw)
    assert not s and s.reason == str(e.value)
    if not any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in kw.values()):
        with pytest.raises(ValueError) as e2:
            saved_bytes(**kw)
        assert str(e2.value) == s.reason
    assert all(bitwise_equal(v, kw[k]) for k, v in keep.items())
