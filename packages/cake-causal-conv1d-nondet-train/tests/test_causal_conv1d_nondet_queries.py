"""is_supported_nondet / workspace_bytes_nondet / saved_bytes_nondet agree with the entry's
checks and with what the forward and CausalConv1dNondetWorkspace.for_plan allocate
(issue 45)."""

import dataclasses

import cake_causal_conv1d_det_train.api as det_api
import pytest
import torch
from _conv_nd_cases import CU_RAGGED, DEV, make_inputs
from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace, make_plan
from cake_causal_conv1d_nondet_train import (
    CausalConv1dNondetWorkspace,
    causal_conv1d_nondet,
    causal_conv1d_nondet_fwd,
    is_supported_nondet,
    make_nondet_plan,
    saved_bytes_nondet,
    workspace_bytes_nondet,
)
from cake_core.support import owned_nbytes
from cake_core.testing import bitwise_equal, no_kernel_launches


@pytest.mark.parametrize("D,W,varlen", [(1, 2, False), (7, 3, True), (100, 8, True)])
@pytest.mark.parametrize("da_once", [0, 1])
@pytest.mark.parametrize("max_tokens,max_seqs", [(0, 1), (75, 6)])
def test_workspace_bytes_is_for_plan_nbytes(D, W, varlen, da_once, max_tokens, max_seqs):
    plan = dataclasses.replace(make_nondet_plan(D, W, torch.float32, DEV, varlen=varlen),
                               bwd_da_once=da_once)
    ws = CausalConv1dNondetWorkspace.for_plan(plan, DEV, max_tokens=max_tokens,
                                              max_seqs=max_seqs)
    assert workspace_bytes_nondet(plan, DEV, max_tokens=max_tokens, max_seqs=max_seqs) == \
        ws.nbytes == workspace_bytes_nondet(plan, max_tokens=max_tokens, max_seqs=max_seqs)


def test_workspace_bytes_refuses_a_det_plan():
    det = make_plan(8, 4, torch.float32, DEV)
    with pytest.raises(ValueError) as err:
        CausalConv1dNondetWorkspace.for_plan(det, DEV, max_tokens=4)
    with pytest.raises(ValueError) as err2:
        workspace_bytes_nondet(det, max_tokens=4)
    assert str(err.value) == str(err2.value)


@pytest.mark.parametrize("B,T,cu", [(2, 10, None), (1, 47, CU_RAGGED), (3, 0, None)])
def test_saved_bytes_is_what_the_forward_keeps(B, T, cu):
    inp = make_inputs(B, T, 12, 4, torch.bfloat16, cu=cu, seed=3)
    kw = {"bias": inp.bias, "activation": "silu", "cu_seqlens": inp.cu,
          "initial_state": inp.h0, "output_final_state": True}
    _, _, saved = causal_conv1d_nondet_fwd(inp.x, inp.weight, **kw)
    want = owned_nbytes(saved.tensors(), exclude=[inp.x, inp.weight, *kw.values()])
    assert saved_bytes_nondet(inp.x, inp.weight, **kw) == want == 0
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    assert saved_bytes_nondet(inp.x.to("meta"), inp.weight.to("meta"), **meta) == want


def test_is_supported_true_on_a_valid_call():
    inp = make_inputs(1, 47, 12, 4, cu=CU_RAGGED, seed=4)
    plan = make_nondet_plan(12, 4, torch.float32, DEV, varlen=True)
    ws = CausalConv1dNondetWorkspace.for_plan(plan, DEV, max_tokens=47, max_seqs=5)
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        s = is_supported_nondet(inp.x, inp.weight, inp.bias, cu_seqlens=inp.cu,
                                initial_state=inp.h0, plan=plan, workspace=ws)
    assert s == (True, "")


def _bad_calls():
    det = make_plan(8, 4, torch.float32, DEV)
    yield from [
        dict(x=torch.ones(2, 10)), dict(weight=torch.ones(8, 9)), dict(activation="relu"),
        dict(cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32)),
        dict(initial_state=torch.ones(2, 8, 4)), dict(output_final_state=1),
        dict(plan=det),
        dict(workspace=CausalConv1dDetWorkspace.for_plan(det, DEV, max_tokens=20)),
    ]


@pytest.mark.parametrize("kw", list(_bad_calls()), ids=lambda kw: ",".join(kw))
def test_is_supported_false_with_the_entrys_message(kw):
    inp = make_inputs(2, 10, 8, 4, seed=5)
    args = dict(x=inp.x, weight=inp.weight, bias=inp.bias) | kw
    keep = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        with pytest.raises(ValueError) as err:
            causal_conv1d_nondet(**args)
        s = is_supported_nondet(**args)
        with pytest.raises(ValueError) as err2:
            saved_bytes_nondet(**args)
    assert s == (False, str(err.value)) and str(err2.value) == str(err.value)
    assert all(bitwise_equal(v, args[k]) for k, v in keep.items())
