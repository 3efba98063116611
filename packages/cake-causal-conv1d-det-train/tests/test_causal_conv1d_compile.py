"""torch.compile (custom ops ``cake_causal_conv1d_det_train::fwd`` / ``::bwd``, fullgraph) and
torch.utils.checkpoint: the same bits as the eager autograd entry."""

import cake_causal_conv1d_det_train.api as api
import pytest
import torch
import torch.utils.checkpoint
from cake_causal_conv1d_det_train import causal_conv1d_det, make_plan

CU = (0, 0, 2, 19, 30)


def _step(x, w, b, h0, cu):
    y, fs = causal_conv1d_det(x, w, b, activation="silu", cu_seqlens=cu, initial_state=h0,
                              output_final_state=True)
    # a loss that reaches y and the final state with non-trivial upstream gradients
    return (y * y).sum() + (fs * fs.detach().sin()).sum(), y, fs


def _run(fn, inp):
    leaves = [t.detach().clone().requires_grad_() for t in (inp.x, inp.weight, inp.bias,
                                                            inp.h0)]
    loss, y, fs = fn(*leaves, inp.cu)
    loss.backward()
    return [y.detach(), fs.detach()] + [t.grad for t in leaves]


def test_compile_fullgraph_same_bits_as_eager(conv):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    inp = conv.make_inputs(1, CU[-1], 12, 4, cu=CU, seed=2)
    want = _run(_step, inp)
    cnt = CompileCounterWithBackend("aot_eager" if conv.DEV.type == "cpu" else "inductor")
    compiled = torch.compile(_step, fullgraph=True, backend=cnt)
    got = _run(compiled, inp)
    for name, a, b in zip(("y", "fs", "dx", "dw", "db", "dh0"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: compiled differs from eager"
    assert cnt.frame_count == 1
    assert "cake_causal_conv1d_det_train.fwd" in cnt.graphs[0].code
    # cu_seqlens values are not read while tracing; the op checks them when it runs
    bad = torch.tensor((0, 0, 25, 19, 30), dtype=torch.int32, device=conv.DEV)
    with pytest.raises(ValueError, match="cu_seqlens"):
        compiled(inp.x, inp.weight, inp.bias, inp.h0, bad)


def test_custom_ops_opcheck(conv):
    """Schema, fake implementations and autograd registration of both ops."""
    inp = conv.make_inputs(1, CU[-1], 6, 3, cu=CU, seed=3)
    x, w, b, h0 = (t.requires_grad_() for t in (inp.x, inp.weight, inp.bias, inp.h0))
    fields = api.plan_to_op_fields(make_plan(6, 3, torch.float32, conv.DEV))
    args = (x, w, b, h0, inp.cu, 1, True, fields, None, None)
    torch.library.opcheck(torch.ops.cake_causal_conv1d_det_train.fwd, args,
                          test_utils=("test_schema", "test_faketensor",
                                      "test_autograd_registration"))
    with torch.no_grad():
        y, fs = torch.ops.cake_causal_conv1d_det_train.fwd(*args)
    bwd_args = (inp.dy, inp.dfs, x.detach(), w.detach(), b.detach(), h0.detach(), inp.cu, 1,
                fields, None, None)
    torch.library.opcheck(torch.ops.cake_causal_conv1d_det_train.bwd, bwd_args,
                          test_utils=("test_schema", "test_faketensor"))


def test_checkpoint_same_grads(conv):
    inp = conv.make_inputs(1, CU[-1], 12, 4, cu=CU, seed=4)

    def ckpt(*args):
        return torch.utils.checkpoint.checkpoint(_step, *args, use_reentrant=False)

    for a, b in zip(_run(ckpt, inp), _run(_step, inp), strict=True):
        assert torch.equal(a, b)
