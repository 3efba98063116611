"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet agree with the entry's
checks and with what for_plan and the forward allocate."""

import dataclasses

import cake_dense_projection_det_gemm.api as det_api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import make_plan
from cake_dense_projection_nondet_gemm import (
    DenseProjectionNondetWorkspace,
    dense_projection_nondet,
    dense_projection_nondet_fwd,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)

DEV = default_device()


def _t(shape, dtype=torch.float32, seed=3):
    return randn(shape, dtype, DEV, seed=seed)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (33, 17, 9), (0, 8, 16), (4096, 128, 8192)])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_workspace_bytes_nondet_matches_for_plan(M, N, K, splits):
    plan = make_nondet_plan(M, N, K, torch.bfloat16, DEV)
    if splits is not None:
        plan = dataclasses.replace(plan, wgrad_splits=splits)
    assert workspace_bytes_nondet(plan, DEV) == \
        DenseProjectionNondetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_nondet_refuses_a_det_plan():
    det = make_plan(4, 4, 4, torch.float32, DEV)
    with pytest.raises(ValueError) as e:
        DenseProjectionNondetWorkspace.for_plan(det, DEV)
    with pytest.raises(ValueError) as e2:
        workspace_bytes_nondet(det)
    assert str(e.value) == str(e2.value)


@pytest.mark.parametrize("lead,N,K", [((5,), 3, 7), ((2, 3), 8, 16), ((0,), 4, 4)])
def test_saved_bytes_nondet_matches_forward(lead, N, K):
    x, w, b = _t((*lead, K)), _t((N, K), seed=4), _t((N,), seed=5)
    _, saved = dense_projection_nondet_fwd(x, w, b)
    assert saved_bytes_nondet(x, w, b) == owned_nbytes(saved.tensors(), exclude=[x, w, b])
    assert saved_bytes_nondet(x.to("meta"), w.to("meta"), b.to("meta")) == 0


def test_is_supported_nondet():
    x, w = _t((4, 16)), _t((8, 16))
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd", "matmul"):
        assert is_supported_nondet(x, w)
        for args, kw in (((x, _t((16, 8))), {}), ((x.half(), w), {}),
                         ((x, w), {"plan": make_plan(4, 8, 16, torch.float32, DEV)}),
                         ((x, w), {"bias": _t((7,))})):
            s = is_supported_nondet(*args, **kw)
            with pytest.raises(ValueError) as e:
                dense_projection_nondet(*args, **kw)
            assert not s and s.reason == str(e.value)
            with pytest.raises(ValueError) as e:
                saved_bytes_nondet(*args, **kw)
            assert s.reason == str(e.value)
