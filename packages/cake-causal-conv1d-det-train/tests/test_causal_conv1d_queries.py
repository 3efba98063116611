"""is_supported / workspace_bytes / saved_bytes agree with the entry's checks and with what
the forward and CausalConv1dDetWorkspace.for_plan allocate (issue 45)."""

import dataclasses
import importlib.util
from pathlib import Path

import cake_causal_conv1d_det_train.api as api
import pytest
import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetWorkspace,
    causal_conv1d_det,
    causal_conv1d_det_fwd,
    is_supported,
    make_plan,
    saved_bytes,
    workspace_bytes,
)
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches, randn
from cake_core.triton_utils import default_device

DEV = default_device()


def _bad_input_cases():
    """The bad inputs of test_causal_conv1d_bad_inputs.py (loaded by path)."""
    path = Path(__file__).with_name("test_causal_conv1d_bad_inputs.py")
    spec = importlib.util.spec_from_file_location("_conv_bad_inputs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = _bad_input_cases()


def _plans():
    for D, W, varlen in ((1, 2, False), (7, 3, True), (64, 4, False), (100, 8, True),
                         (4096, 4, False)):
        plan = make_plan(D, W, torch.float32, DEV, varlen=varlen)
        yield plan
        yield dataclasses.replace(plan, bwd_da_once=1 - plan.bwd_da_once)
    yield dataclasses.replace(make_plan(33, 4, torch.bfloat16, DEV), block_t_bwd=1,
                              block_d_bwd=4)


@pytest.mark.parametrize("plan", list(_plans()), ids=str)
@pytest.mark.parametrize("max_tokens,max_seqs", [(0, 1), (1, 1), (75, 6), (4097, 3)])
def test_workspace_bytes_is_for_plan_nbytes(plan, max_tokens, max_seqs):
    ws = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=max_tokens, max_seqs=max_seqs)
    assert workspace_bytes(plan, DEV, max_tokens=max_tokens, max_seqs=max_seqs) == ws.nbytes
    assert workspace_bytes(plan, max_tokens=max_tokens, max_seqs=max_seqs) == ws.nbytes


@pytest.mark.parametrize("plan,kw", [("plan", {"max_tokens": 4}),
                                     (None, {"max_tokens": 4}),
                                     (make_plan(8, 4, torch.float32, DEV), {"max_tokens": -1}),
                                     (make_plan(8, 4, torch.float32, DEV),
                                      {"max_tokens": 4, "max_seqs": 0})])
def test_workspace_bytes_bad_arguments_raise_for_plans_error(plan, kw):
    with pytest.raises(ValueError) as err:
        CausalConv1dDetWorkspace.for_plan(plan, DEV, **kw)
    with pytest.raises(ValueError) as err2:
        workspace_bytes(plan, DEV, **kw)
    assert str(err.value) == str(err2.value)


CALLS = {  # (B, T, D, W, cu_seqlens), entry options
    "fixed": ((2, 10, 8, 4, None), {}),
    "silu state": ((3, 5, 7, 3, None), {"activation": "silu", "state": True}),
    "ragged": ((1, 75, 12, 4, (0, 0, 1, 3, 7, 47, 75)), {"state": True, "final": True}),
    "T = 0": ((2, 0, 5, 2, None), {"final": True}),
    "wide": ((1, 3, 300, 8, (0, 1, 3)), {"activation": "swish"}),
}


def _call(name, dtype=torch.float32):
    (B, T, D, W, cu), opt = CALLS[name]
    N = B if cu is None else len(cu) - 1
    x = randn((B, T, D), dtype, DEV, seed=1)
    w = randn((D, W), torch.float32, DEV, seed=2)
    kw = {"bias": randn((D,), dtype, DEV, seed=3), "activation": opt.get("activation"),
          "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=DEV) if cu else None,
          "initial_state": randn((N, D, W - 1), dtype, DEV, seed=4) if opt.get("state")
          else None, "output_final_state": bool(opt.get("final"))}
    return x, w, kw


@pytest.mark.parametrize("name", list(CALLS))
def test_saved_bytes_is_what_the_forward_keeps(name):
    x, w, kw = _call(name, torch.bfloat16)
    _, _, saved = causal_conv1d_det_fwd(x, w, **kw)
    want = owned_nbytes(saved.tensors(), exclude=[x, w, *kw.values()])
    assert saved_bytes(x, w, **kw) == want == 0
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    assert saved_bytes(x.to("meta"), w.to("meta"), **meta) == want


def test_is_supported_true_on_valid_calls():
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        for name in CALLS:
            x, w, kw = _call(name)
            plan = make_plan(x.shape[-1], w.shape[1], x.dtype, DEV,
                             varlen=kw["cu_seqlens"] is not None)
            ws = CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=x.shape[0] *
                                                   x.shape[1], max_seqs=8)
            assert is_supported(x, w, **kw) == (True, "")
            assert is_supported(x, w, **kw, plan=plan, workspace=ws) == (True, "")


def _bad_calls():
    for name, (make, kw, _) in CASES.items():
        yield name, make, kw
    x, w = randn((2, 10, 8), torch.float32, DEV), randn((8, 4), torch.float32, DEV)
    plan = make_plan(8, 4, torch.float32, DEV)
    yield "plan for another W", lambda: (x, w), {"plan": make_plan(8, 3, torch.float32, DEV)}
    yield "workspace too small", lambda: (x, w), {
        "plan": plan, "workspace": CausalConv1dDetWorkspace.for_plan(plan, DEV, max_tokens=1)}


@pytest.mark.parametrize("name,make,kw", list(_bad_calls()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_is_supported_false_with_the_entrys_message(name, make, kw):
    x, w = make()
    tensors = [t for t in (x, w, *kw.values()) if isinstance(t, torch.Tensor)
               and t.device.type != "meta"]
    keep = [t.clone() for t in tensors]
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            causal_conv1d_det(x, w, **kw)
        s = is_supported(x, w, **kw)
        meta = any(isinstance(t, torch.Tensor) and t.device.type == "meta"
                   for t in (x, w, *kw.values()))
        if not meta:  # saved_bytes sizes meta tensors: the one check it skips
            with pytest.raises(ValueError) as err2:
                saved_bytes(x, w, **kw)
            assert str(err2.value) == str(err.value)
    assert not s and s == (False, str(err.value))
    assert all(bitwise_equal(a, b) for a, b in zip(keep, tensors, strict=True))
