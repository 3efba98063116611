"""is_supported / workspace_bytes / saved_bytes agree with the entry's checks and with what
for_plan and the forward allocate."""

import dataclasses

import cake_lm_head_loss_det_train.api as api
import pytest
import torch
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_core.triton_utils import default_device, is_interpreting
from cake_lm_head_loss_det_train import (
    LMHeadLossDetWorkspace,
    is_supported,
    lm_head_loss_det,
    lm_head_loss_det_fwd,
    make_plan,
    saved_bytes,
    workspace_bytes,
)

DEV = default_device()
LAUNCHES = ("_forward_impl", "_backward_impl", "_run_chunks")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("H,V", [(1, 1), (16, 10), (33, 1000), (4096, 128256)])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dh_split", [None, 1, 3])
def test_workspace_bytes_matches_for_plan(H, V, dtype, dh_split):
    plan = make_plan(H, V, dtype, DEV)
    if dh_split is not None:
        plan = dataclasses.replace(plan, dh_split=dh_split)
    assert workspace_bytes(plan, DEV, dtype) == workspace_bytes(plan, dtype=dtype) == \
        LMHeadLossDetWorkspace.for_plan(plan, DEV, dtype).nbytes
    assert workspace_bytes(plan) == LMHeadLossDetWorkspace.for_plan(plan, DEV).nbytes


def test_workspace_bytes_refuses_as_for_plan():
    plan = make_plan(16, 10, torch.float32, DEV)
    for args in ((None, DEV), (plan, DEV, torch.float64), (plan, "nowhere")):
        with pytest.raises(ValueError) as e:
            LMHeadLossDetWorkspace.for_plan(*args)
        with pytest.raises(ValueError) as e2:
            workspace_bytes(*args)
        assert str(e.value) == str(e2.value)


def _inputs(lead, H, V, dtype, layout):
    T = 1
    for s in lead:
        T *= s
    h = randn((*lead, H), dtype, DEV, seed=1)
    if layout == "transposed" and len(lead) == 2:   # [S, B, H] view of [B, S, H]: copied
        h = randn((lead[1], lead[0], H), dtype, DEV, seed=1).transpose(0, 1)
    y = (torch.arange(T, device=DEV) * 7 % V).reshape(lead)
    if layout == "transposed":                      # strided labels: copied contiguous
        y = torch.stack([y, y], -1)[..., 0]
    y.view(-1)[::3] = -100
    return h, randn((V, H), dtype, DEV, seed=2), y


@pytest.mark.parametrize("lead", [(6,), (2, 3), (0,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("layout", ["plain", "transposed"])
def test_saved_bytes_matches_forward(lead, dtype, reduction, layout):
    H, V = 16, 10
    h, w, y = _inputs(lead, H, V, dtype, layout)
    b = randn((V,), torch.float32, DEV, seed=3)
    base = make_plan(H, V, dtype, DEV, reduction=reduction)
    plans = [None, dataclasses.replace(base, chunk_tokens=4)]
    if reduction != "none":
        plans += [dataclasses.replace(base, grad_in_forward=0),
                  dataclasses.replace(base, defer_dw_tokens=0),
                  dataclasses.replace(base, defer_dw_tokens=64)]
    for plan in plans:
        for bias in (None, b):
            kw = dict(bias=bias, reduction=reduction, plan=plan)
            _, saved = lm_head_loss_det_fwd(h, w, y, **kw)
            want = owned_nbytes(saved.tensors(), exclude=[h, w, y, bias])
            assert saved_bytes(h, w, y, **kw) == want, (plan, bias)
            meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                    for t in (h, w, y)]
            mb = None if bias is None else bias.to("meta")
            assert saved_bytes(*meta, **{**kw, "bias": mb}) == want


def test_is_supported_true_and_launches_nothing():
    h, w, y = _inputs((6,), 16, 10, torch.float32, "plain")
    plan = make_plan(16, 10, torch.float32, DEV)
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(h, w, y, plan=plan,
                         workspace=LMHeadLossDetWorkspace.for_plan(plan, DEV, torch.float32))
        assert s and s.reason == ""
        assert is_supported(h, w, y, reduction="none", z_loss=1e-4, logit_softcap=30.0)


def _bad_cases():
    h, w, y = _inputs((6,), 16, 10, torch.float32, "plain")
    return {
        "hidden 1-D": ((h[0], w, y[:1].reshape(())), {}),
        "hidden strided": ((randn((16, 6), torch.float32, DEV).t(), w, y), {}),
        "weight transposed": ((h, w.t().contiguous(), y), {}),
        "labels int32": ((h, w, y.int()), {}),
        "label too large": ((h, w, y.clamp(min=0) + 10), {}),
        "bias dtype": ((h, w, y), {"bias": randn((10,), torch.float16, DEV)}),
        "reduction": ((h, w, y), {"reduction": "avg"}),
        "label_smoothing": ((h, w, y), {"label_smoothing": 1.5}),
        "logit_softcap 0": ((h, w, y), {"logit_softcap": 0.0}),
        "plan for another V": ((h, w, y), {"plan": make_plan(16, 11, torch.float32, DEV)}),
        "grad_in_forward with none": ((h, w, y), {"reduction": "none", "plan": make_plan(
            16, 10, torch.float32, DEV)}),
        "workspace of another plan": ((h, w, y), {"workspace": LMHeadLossDetWorkspace.for_plan(
            make_plan(16, 11, torch.float32, DEV), DEV, torch.float32)}),
        "main_grad shape": ((h, w, y), {"main_grad": torch.zeros(16, 10, device=DEV)}),
        "devices differ": ((h, w.to("meta"), y), {}),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_is_supported_false_with_the_entrys_message(case):
    if case == "label too large" and DEV.type != "cpu":
        pytest.skip("label values on a GPU are not read (no host sync)")
    args, kw = _bad_cases()[case]
    ts = [t for t in (*args, *kw.values()) if isinstance(t, torch.Tensor)]
    keep = [t.clone() for t in ts if t.device.type != "meta"]
    with no_kernel_launches(api, *LAUNCHES):
        s = is_supported(*args, **kw)
        with pytest.raises(ValueError) as e:
            lm_head_loss_det(*args, **kw)
    assert not s and s.reason == str(e.value)
    if case != "label too large" and not any(t.device.type == "meta" for t in ts):
        with pytest.raises(ValueError) as e2:
            saved_bytes(*args, **kw)
        assert str(e2.value) == s.reason
    assert all(bitwise_equal(a, c) for a, c in zip(keep, [t for t in ts
                                                          if t.device.type != "meta"],
                                                   strict=True))


def test_saved_bytes_on_meta_serves_a_cuda_plan():
    """A CUDA plan (cuBLAS GEMMs for 16-bit inputs) sizes meta tensors: the query runs no
    backend check, so the plan's device condition does not refuse meta."""
    plan = make_plan(16, 10, torch.bfloat16, "cuda")
    assert plan.cublas_gemms == 1
    h, w = (torch.empty(6, 16, dtype=torch.bfloat16, device="meta"),
            torch.empty(10, 16, dtype=torch.bfloat16, device="meta"))
    y = torch.empty(6, dtype=torch.int64, device="meta")
    assert saved_bytes(h, w, y, plan=plan) == saved_bytes(h, w, y, plan=dataclasses.replace(
        plan, cublas_gemms=0))
    # the CPU tensors are refused either by the plan (interpreter) or, where Triton compiles
    # for CUDA, by the device check that comes first
    msg = ("cublas_gemms=1 needs bf16/fp16 inputs on CUDA" if is_interpreting()
           else "Triton compiles for CUDA")
    with pytest.raises(ValueError, match=msg):
        lm_head_loss_det(torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(
            10, 16, dtype=torch.bfloat16), torch.arange(6), plan=plan)
