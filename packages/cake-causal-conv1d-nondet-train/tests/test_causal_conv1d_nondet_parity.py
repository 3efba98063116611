"""Float64 parity (the det package's reference) on a few of the det package's cases: packed
documents with an empty and a one-token one, initial and final states, SiLU or none; the
low-level forward / backward and a workspace; torch.compile through this package's ops."""

import pytest
import torch
from _conv_nd_cases import CU_RAGGED, DEV, NAMES, make_inputs, run_nondet, run_reference
from cake_causal_conv1d_nondet_train import (
    CausalConv1dNondetGrads,
    CausalConv1dNondetSavedSet,
    CausalConv1dNondetWorkspace,
    causal_conv1d_nondet_bwd,
    causal_conv1d_nondet_fwd,
    make_nondet_plan,
)
from cake_core.testing import assert_close_to_reference


def _check(got, ref, dtype):
    for name in NAMES:
        if ref[name] is None:
            assert got[name] is None, name
        elif name == "fs":  # copies of the inputs: exact
            assert torch.equal(got[name], ref[name].to(dtype)), name
        else:
            assert_close_to_reference(got[name], ref[name], dtype, name)


@pytest.mark.parametrize("dtype,W,activation", [(torch.float32, 4, "silu"),
                                                (torch.float32, 3, None),
                                                (torch.bfloat16, 4, "silu")], ids=str)
def test_parity_packed_ragged(dtype, W, activation):
    inp = make_inputs(1, CU_RAGGED[-1], 24, W, dtype, cu=CU_RAGGED, seed=W)
    _check(run_nondet(inp, activation), run_reference(inp, activation), dtype)


def test_parity_fixed_length_without_bias_or_state():
    inp = make_inputs(2, 37, 20, 2, bias=False, h0=False, seed=9)
    _check(run_nondet(inp, "silu"), run_reference(inp, "silu"), torch.float32)
    from cake_causal_conv1d_nondet_train import causal_conv1d_nondet

    y, _ = causal_conv1d_nondet(inp.x.requires_grad_(), inp.weight)
    assert type(y.grad_fn).__name__ == "_CausalConv1dNondetFunctionBackward"


def test_low_level_and_workspace_match_autograd():
    inp = make_inputs(1, CU_RAGGED[-1], 24, 4, cu=CU_RAGGED, seed=3)
    want = run_nondet(inp, "silu")
    plan = make_nondet_plan(24, 4, torch.float32, DEV, varlen=True)
    ws = CausalConv1dNondetWorkspace.for_plan(plan, DEV, max_tokens=CU_RAGGED[-1],
                                              max_seqs=len(CU_RAGGED) - 1)
    y, fs, saved = causal_conv1d_nondet_fwd(inp.x, inp.weight, inp.bias, activation="silu",
                                            cu_seqlens=inp.cu, initial_state=inp.h0,
                                            output_final_state=True)
    assert isinstance(saved, CausalConv1dNondetSavedSet) and saved.plan == plan
    g = causal_conv1d_nondet_bwd(inp.dy, inp.dfs, saved, workspace=ws)
    assert isinstance(g, CausalConv1dNondetGrads)
    got = dict(y=y, fs=fs, dx=g.dx, dweight=g.dweight, dbias=g.dbias, dh0=g.dinitial_state)
    for name in NAMES:
        torch.testing.assert_close(got[name], want[name], msg=name)
    again = run_nondet(inp, "silu", workspace=ws)
    for name in NAMES:
        torch.testing.assert_close(again[name], want[name], msg=name)


def test_compile_fullgraph_runs_this_packages_ops():
    from cake_causal_conv1d_nondet_train import causal_conv1d_nondet
    from torch._dynamo.testing import CompileCounterWithBackend

    def step(x, w, b, h0, cu):
        y, fs = causal_conv1d_nondet(x, w, b, activation="silu", cu_seqlens=cu,
                                     initial_state=h0, output_final_state=True)
        return (y * y).sum() + (fs * fs.detach().sin()).sum(), y

    def run(fn, inp):
        leaves = [t.detach().clone().requires_grad_() for t in (inp.x, inp.weight, inp.bias,
                                                                inp.h0)]
        loss, y = fn(*leaves, inp.cu)
        loss.backward()
        return [y.detach()] + [t.grad for t in leaves]

    torch._dynamo.reset()
    inp = make_inputs(1, 30, 12, 4, cu=(0, 0, 2, 19, 30), seed=2)
    want = run(step, inp)
    cnt = CompileCounterWithBackend("aot_eager" if DEV.type == "cpu" else "inductor")
    got = run(torch.compile(step, fullgraph=True, backend=cnt), inp)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert cnt.frame_count == 1
    code = cnt.graphs[0].code
    assert "cake_causal_conv1d_nondet_train.fwd" in code
    assert "cake_causal_conv1d_det_train" not in code
