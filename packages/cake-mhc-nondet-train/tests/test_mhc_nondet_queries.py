"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet of the prepare agree
with its checks and with what for_plan and the prepare allocate."""

import dataclasses

import cake_mhc_det_train.api as det_api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_mhc_det_train import make_plan
from cake_mhc_nondet_train import (
    MHCNondetWorkspace,
    is_supported_nondet,
    make_nondet_plan,
    mhc_nondet_prepare,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)

DEV = default_device()
LAUNCHES = ("_launch_prepare_fwd", "_launch_prepare_bwd", "_launch_finish_fwd",
            "_launch_finish_bwd")


def _inputs(lead, n, C):
    M = 2 * n + n * n
    return {"X": randn((*lead, n, C), torch.float32, DEV, seed=1),
            "phi": randn((n * C, M), torch.float32, DEV, seed=2, scale=0.1),
            "alpha": torch.tensor([0.8, 1.1, 1.3], device=DEV),
            "bias": randn((M,), torch.float32, DEV, seed=3, scale=0.5)}


@pytest.mark.parametrize("n,C", [(2, 1), (4, 33), (8, 7168)])
@pytest.mark.parametrize("slices", [None, 1, 3])
def test_workspace_bytes_nondet_matches_for_plan(n, C, slices):
    plan = make_nondet_plan(n, C, torch.bfloat16, DEV)
    if slices is not None:
        plan = dataclasses.replace(plan, dphi_slices=slices)
    assert workspace_bytes_nondet(plan, DEV) == MHCNondetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_nondet_refuses_a_det_plan():
    det = make_plan(4, 16, torch.float32, DEV)
    with pytest.raises(ValueError) as e:
        MHCNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes_nondet(det)
    assert str(e.value) == str(e2.value)


@pytest.mark.parametrize("lead,n,C", [((6,), 4, 16), ((2, 3), 2, 8), ((0,), 4, 16)])
def test_saved_bytes_nondet_matches_prepare(lead, n, C):
    kw = _inputs(lead, n, C)
    Xs = [kw["X"]] + ([kw["X"].transpose(0, 1)] if len(lead) == 2 else [])
    for X in Xs:
        kw["X"] = X
        _, handle = mhc_nondet_prepare(**kw)
        want = owned_nbytes(handle.tensors(), exclude=list(kw.values()))
        assert saved_bytes_nondet(**kw) == want
        meta = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
                for k, v in kw.items()}
        assert saved_bytes_nondet(**meta) == want


def test_is_supported_nondet():
    kw = _inputs((6,), 4, 16)
    bad = {"X fp64": {**kw, "X": kw["X"].double()},
           "n = 3": {**kw, "X": kw["X"][:, :3]},
           "eps 0": {**kw, "eps": 0.0},
           "det plan": {**kw, "plan": make_plan(4, 16, torch.float32, DEV)},
           "plan of another C": {**kw, "plan": make_nondet_plan(4, 8, torch.float32, DEV)}}
    with no_kernel_launches(det_api, *LAUNCHES):
        assert is_supported_nondet(**kw)
        for case in bad.values():
            s = is_supported_nondet(**case)
            with pytest.raises(ValueError) as e:
                mhc_nondet_prepare(**case)
            with pytest.raises(ValueError) as e2:
                saved_bytes_nondet(**case)
            assert not s and s.reason == str(e.value) == str(e2.value)
