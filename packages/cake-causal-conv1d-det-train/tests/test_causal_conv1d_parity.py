"""Parity with the float64 reference (per-sequence F.conv1d) on fresh random inputs: y, the
final state (exact), dx, dweight, dbias, dinitial_state, with gradient into the final state."""

import pytest
import torch
from cake_causal_conv1d_det_train import (
    CausalConv1dDetWorkspace,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
    make_plan,
)
from cake_core.testing import (
    assert_close_to_reference,
    bitwise_equal,
    poison_,
    poisoned_empty,
    randn,
)

NAMES = ("y", "dx", "dweight", "dbias", "dh0")


def _check(got, ref, dtype, ofs=True):
    for name in NAMES:
        if ref[name] is None and got[name] is not None:  # T = 0: autograd gives no grad
            assert torch.equal(got[name], torch.zeros_like(got[name])), name
            continue
        if ref[name] is None:
            assert got[name] is None, name
            continue
        if name in ("y", "dx", "dh0"):
            assert got[name].dtype == dtype, name
        assert_close_to_reference(got[name], ref[name], dtype, name)
    if ofs:  # the final state is a copy of inputs: exact
        assert got["fs"].dtype == dtype
        assert torch.equal(got["fs"], ref["fs"].to(dtype)), "final state is not the inputs"
    else:
        assert got["fs"] is None


# packed: every (W, activation) in fp32, every W with SiLU and one without in 16-bit;
# fixed length: every W, activation and dtype at least once (the interpreter is slow)
PACKED = [(torch.float32, W, a) for W in (2, 3, 4) for a in (None, "silu")] + [
    (dt, W, "silu") for dt in (torch.bfloat16, torch.float16) for W in (2, 3, 4)] + [
    (torch.bfloat16, 4, None), (torch.float16, 3, None)]
FIXED = [(torch.float32, 2, "silu"), (torch.float32, 4, None), (torch.bfloat16, 3, "silu"),
         (torch.float16, 4, "silu")]


@pytest.mark.parametrize("dtype,W,activation", PACKED, ids=str)
def test_parity_packed(conv, dtype, W, activation):
    """Packed documents (empty, 1 token, shorter than W - 1, long), initial and final state."""
    T = conv.CU_RAGGED[-1]
    inp = conv.make_inputs(1, T, 24, W, dtype, cu=conv.CU_RAGGED, seed=W * 10)
    _check(conv.run_cake(inp, activation), conv.run_reference(inp, activation), dtype)


@pytest.mark.parametrize("dtype,W,activation", FIXED, ids=str)
def test_parity_fixed_length(conv, dtype, W, activation):
    """B = 2, T = 37 (not a multiple of the 32-token blocks), D = 72 (two channel blocks),
    fp32 parameters (with 16-bit inputs too)."""
    inp = conv.make_inputs(2, 37, 72, W, dtype, seed=W, param_dtype=torch.float32)
    got = conv.run_cake(inp, activation)
    assert got["dweight"].dtype == torch.float32 and got["dbias"].dtype == torch.float32
    _check(got, conv.run_reference(inp, activation), dtype)


@pytest.mark.parametrize("W", [5, 8])
def test_wider_kernels(conv, W):
    inp = conv.make_inputs(1, 14, 8, W, cu=(0, 2, 14), seed=W)
    _check(conv.run_cake(inp, "swish"), conv.run_reference(inp, "silu"), torch.float32)


@pytest.mark.parametrize("case", ["no-bias-no-state", "no-final-state", "swish-alias"])
def test_options(conv, case):
    kw = dict(bias=case != "no-bias-no-state", h0=case != "no-bias-no-state")
    ofs = case != "no-final-state"
    act = "swish" if case == "swish-alias" else "silu"
    inp = conv.make_inputs(3, 21, 5, 4, cu=None, seed=7, **kw)
    _check(conv.run_cake(inp, act, ofs), conv.run_reference(inp, "silu", ofs), torch.float32,
           ofs)


@pytest.mark.parametrize("shape,cu", [((2, 0, 8), None), ((1, 0, 8), (0, 0, 0)),
                                      ((1, 5, 1), (0, 5)), ((1, 2, 3), (0, 1, 1, 2))])
def test_edge_shapes(conv, shape, cu):
    """T = 0, only empty documents, D = 1, every document shorter than W - 1."""
    B, T, D = shape
    inp = conv.make_inputs(B, T, D, 4, cu=cu, seed=3)
    got, ref = conv.run_cake(inp, "silu"), conv.run_reference(inp, "silu")
    _check(got, ref, torch.float32)
    if T == 0:
        assert torch.equal(got["dweight"], torch.zeros_like(got["dweight"]))
        assert torch.equal(got["fs"], inp.h0)  # the state passes through unchanged


def test_strided_inputs(conv):
    """x a slice of a wider projection (time stride 2D), the state a view of FLA's
    [N, D, W] cache (slots 1..W-1), dy and dfinal transposed views."""
    B, T, D, W = 2, 30, 12, 4
    big = randn((B, T, 3 * D), torch.float32, conv.DEV, seed=1)
    cache = randn((B, D, W), torch.float32, conv.DEV, seed=2)
    inp = conv.make_inputs(B, T, D, W, seed=3)
    inp.x, inp.h0 = big[:, :, D:2 * D], cache[:, :, 1:]
    inp.dfs = inp.dfs.transpose(0, 1).contiguous().transpose(0, 1)
    assert not inp.x.is_contiguous() and not inp.h0.is_contiguous()
    got = conv.run_cake(inp, "silu")
    _check(got, conv.run_reference(inp, "silu"), torch.float32)
    inp.x, inp.h0 = inp.x.contiguous(), inp.h0.contiguous()
    again = conv.run_cake(inp, "silu")
    for k in got:
        assert bitwise_equal(got[k], again[k]), k


def test_low_level_matches_autograd(conv):
    cu = (0, 2, 5, 40)
    inp = conv.make_inputs(1, cu[-1], 20, 3, torch.bfloat16, cu=cu)
    y, fs, saved = causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, activation="silu",
                                         cu_seqlens=inp.cu, initial_state=inp.h0,
                                         output_final_state=True)
    g = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved)
    auto = conv.run_cake(inp, "silu")
    for a, b in ((y, auto["y"]), (fs, auto["fs"]), (g.dx, auto["dx"]),
                 (g.dweight, auto["dweight"]), (g.dbias, auto["dbias"]),
                 (g.dinitial_state, auto["dh0"])):
        assert bitwise_equal(a, b)
    g0 = causal_conv1d_det_bwd(inp.dy, None, saved)  # no gradient into the final state
    ref = conv.run_reference(inp, "silu", output_final_state=False)
    assert_close_to_reference(g0.dx, ref["dx"], torch.bfloat16, "dx")
    assert_close_to_reference(g0.dinitial_state, ref["dh0"], torch.bfloat16, "dh0")


def test_outputs_and_workspace_fully_written(conv):
    """Every buffer the entry allocates, and the caller's workspace, starts as NaN: an
    element a kernel skipped would stay NaN. Same bits as without the workspace."""
    cu = (0, 0, 2, 40)
    inp = conv.make_inputs(1, cu[-1], 20, 4, torch.float16, cu=cu)
    want = conv.run_cake(inp, "silu")
    with poisoned_empty(floating_only=True):
        plan = make_plan(20, 4, torch.float16, conv.DEV, varlen=True)  # the rule's packed plan
        ws = CausalConv1dDetWorkspace.for_plan(plan, conv.DEV, max_tokens=200, max_seqs=10)
        for name in ws.names:
            poison_(ws[name])
        got = conv.run_cake(inp, "silu", plan=plan, workspace=ws)
    for k in got:
        assert torch.isfinite(got[k].float()).all(), k
        assert bitwise_equal(got[k], want[k]), k
