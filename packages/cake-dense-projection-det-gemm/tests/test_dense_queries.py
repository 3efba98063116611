"""is_supported / workspace_bytes / saved_bytes agree with the entry's checks and with what
for_plan and the forward allocate."""

import dataclasses

import cake_dense_projection_det_gemm.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_core.triton_utils import default_device
from cake_dense_projection_det_gemm import (
    DenseProjectionDetWorkspace,
    dense_projection_det,
    dense_projection_det_fwd,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)

DEV = default_device()
SHAPES = [(1, 1, 1), (5, 3, 7), (33, 17, 9), (0, 8, 16), (130, 24, 40), (4096, 128, 8192)]


def _t(shape, dtype=torch.float32, seed=3):
    return randn(shape, dtype, DEV, seed=seed)


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_workspace_bytes_matches_for_plan(M, N, K, dtype, splits):
    plan = make_plan(M, N, K, dtype, DEV)
    if splits is not None:
        plan = dataclasses.replace(plan, wgrad_splits=splits)
    ws = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    assert workspace_bytes(plan) == workspace_bytes(plan, DEV) == ws.nbytes


def test_workspace_bytes_refuses_as_for_plan():
    for bad in (None, "plan"):
        with pytest.raises(ValueError) as e:
            DenseProjectionDetWorkspace.for_plan(bad, DEV)
        with pytest.raises(ValueError, match=str(e.value).split(",")[0]):
            workspace_bytes(bad)
    with pytest.raises(ValueError, match="device"):
        workspace_bytes(make_plan(4, 4, 4, torch.float32, DEV), device="nowhere")


@pytest.mark.parametrize("lead,N,K", [((5,), 3, 7), ((2, 3), 8, 16), ((0,), 4, 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_saved_bytes_matches_forward(lead, N, K, bias):
    x, w = _t((*lead, K)), _t((N, K), seed=4)
    b = _t((N,), seed=5) if bias else None
    _, saved = dense_projection_det_fwd(x, w, b)
    assert saved_bytes(x, w, b) == owned_nbytes(saved.tensors(), exclude=[x, w, b]) == 0
    xm, wm = x.to("meta"), w.to("meta")
    assert saved_bytes(xm, wm, None if b is None else b.to("meta")) == 0


def _bad_cases():
    x, w = _t((4, 16)), _t((8, 16))
    return {
        "x int": ((x.to(torch.int32), w), {}),
        "K = 0": ((_t((4, 0)), _t((8, 0))), {}),
        "weight transposed": ((x, _t((16, 8))), {}),
        "bias shape": ((x, w), {"bias": _t((7,))}),
        "main_grad strided": ((x, w), {"main_grad": _t((16, 8)).t()}),
        "plan for another N": ((x, w), {"plan": make_plan(4, 9, 16, torch.float32, DEV)}),
        "devices differ": ((x, torch.ones(8, 16, device="meta")), {}),
    }


def test_is_supported_true_and_launches_nothing():
    x, w, b = _t((4, 16)), _t((8, 16)), _t((8,))
    plan = make_plan(4, 8, 16, torch.float32, DEV)
    ws = DenseProjectionDetWorkspace.for_plan(plan, DEV)
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd", "matmul"):
        s = is_supported(x, w, b, plan=plan, workspace=ws)
    assert s and s.ok and s.reason == ""


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_is_supported_false_with_the_entrys_message(case):
    args, kw = _bad_cases()[case]
    keep = [t.clone() for t in (*args, *kw.values())
            if isinstance(t, torch.Tensor) and t.device.type != "meta"]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd", "matmul"):
        s = is_supported(*args, **kw)
        with pytest.raises(ValueError) as e:
            dense_projection_det(*args, **kw)
    assert not s and s.reason == str(e.value)
    if not any(t.device.type == "meta" for t in (*args, *kw.values())
               if isinstance(t, torch.Tensor)):
        with pytest.raises(ValueError, match="^" + __import__("re").escape(s.reason) + "$"):
            saved_bytes(*args, **kw)
    again = [t for t in (*args, *kw.values())
             if isinstance(t, torch.Tensor) and t.device.type != "meta"]
    assert all(bitwise_equal(a, c) for a, c in zip(keep, again, strict=True))
