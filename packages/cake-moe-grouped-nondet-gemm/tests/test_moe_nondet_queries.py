"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet of the grouped GEMM
entry agree with its checks and with what for_plan and the forward allocate."""

import dataclasses

import cake_moe_grouped_det_gemm.api as det_api
import pytest
import torch
from _moe_nd_cases import DEV, make
from cake_core.support import owned_nbytes
from cake_core.testing import no_kernel_launches
from cake_moe_grouped_det_gemm import make_plan
from cake_moe_grouped_nondet_gemm import (
    MoEGroupedNondetWorkspace,
    is_supported_nondet,
    make_nondet_plan,
    moe_grouped_nondet_gemm,
    moe_grouped_nondet_gemm_fwd,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)
from test_moe_nondet_bad_inputs import CASES, VALUE_CASES, _base


@pytest.mark.parametrize("M,E,N,K", [(1, 1, 1, 1), (37, 3, 5, 7), (4096, 8, 512, 1024)])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_workspace_bytes_nondet_matches_for_plan(M, E, N, K, splits):
    plan = make_nondet_plan(M, E, N, K, torch.bfloat16, DEV)
    if splits is not None:
        plan = dataclasses.replace(plan, wgrad_splits=splits)
    assert workspace_bytes_nondet(plan, DEV) == \
        MoEGroupedNondetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_nondet_refuses_a_det_plan():
    det = make_plan(4, 2, 4, 4, torch.float32, DEV)
    with pytest.raises(ValueError) as e:
        MoEGroupedNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes_nondet(det)
    assert str(e.value) == str(e2.value)


@pytest.mark.parametrize("sizes,tail", [([3, 0, 5], 0), ([1], 2), ([4, 1, 0, 2], 3)])
def test_saved_bytes_nondet_matches_forward(sizes, tail):
    x, w, offs, _ = make(sizes, N=8, K=16, tail=tail)
    _, saved = moe_grouped_nondet_gemm_fwd(x, w, offs)
    assert saved_bytes_nondet(x, w, offs) == owned_nbytes(saved.tensors(),
                                                          exclude=[x, w, offs])
    assert saved_bytes_nondet(x.to("meta"), w.to("meta"), offs.to("meta")) == 4 * len(sizes)


def test_is_supported_nondet_true():
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd", "_grouped_mm"):
        assert is_supported_nondet(**_base())


@pytest.mark.parametrize("name", list(CASES))
def test_is_supported_nondet_false_with_the_entrys_message(name):
    if name in VALUE_CASES and DEV.type != "cpu":
        pytest.skip("offs values on a GPU are not read by the host (no sync)")
    kw = CASES[name][0](_base())
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd", "_grouped_mm"):
        s = is_supported_nondet(**kw)
        with pytest.raises(ValueError) as e:
            moe_grouped_nondet_gemm(**kw)
        with pytest.raises(ValueError) as e2:
            saved_bytes_nondet(**kw)
    assert not s and s.reason == str(e.value) == str(e2.value)
