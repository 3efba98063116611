"""The plan's candidate kernels (``bwd_window``: the SiLU backward loads each shifted x tile
once; ``weight_tap_major``: the taps read from a ``[W, D]`` copy) against the float64
reference on the main parity cases, bitwise repeats, the same bits as the default plan under
the interpreter (same sums in the same order), and the plan field's checks / upgrade
message."""

import dataclasses

import pytest
import torch
from cake_causal_conv1d_det_train import CausalConv1dDetPlan, make_plan
from cake_core.testing import assert_bitwise_repeat, assert_close_to_reference, bitwise_equal
from cake_core.triton_utils import is_interpreting

VARIANTS = {"window": dict(bwd_window=1), "tap-major": dict(weight_tap_major=1),
            "both": dict(bwd_window=1, weight_tap_major=1)}
# packed (empty, 1 token, shorter than W - 1, long documents; initial and final states):
# every W with SiLU and one without, fp32 and 16-bit
PACKED = [(torch.float32, W, "silu") for W in (2, 3, 4)] + [
    (torch.float32, 3, None), (torch.bfloat16, 4, "silu"), (torch.float16, 2, "silu"),
    (torch.bfloat16, 3, None)]
FIXED = [(torch.float32, 4, "silu"), (torch.bfloat16, 2, "silu"), (torch.float16, 3, None)]


def _check(got, ref, dtype, ofs=True):
    """As the parity tests: every output and gradient near float64; the final state exact."""
    for name in ("y", "dx", "dweight", "dbias", "dh0"):
        if ref[name] is None:
            assert got[name] is None, name
            continue
        assert_close_to_reference(got[name], ref[name], dtype, name)
    if ofs:
        assert torch.equal(got["fs"], ref["fs"].to(dtype)), "final state is not the inputs"
    else:
        assert got["fs"] is None


def _plan(D, W, dtype, dev, variant, **extra):
    return dataclasses.replace(make_plan(D, W, dtype, dev), **VARIANTS[variant], **extra)


def _same_as_default(conv, inp, act, plan, got):
    """Under the interpreter the variant's bits equal the default plan's (compiled, fused
    multiply-adds may differ: not promised across plans)."""
    if not is_interpreting():
        return
    base = dataclasses.replace(plan, bwd_window=0, weight_tap_major=0)
    want = conv.run_cake(inp, act, plan=base)
    for k, v in got.items():
        if v is not None:
            assert bitwise_equal(v, want[k]), k


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype,W,activation", PACKED, ids=str)
def test_variant_parity_packed(conv, variant, dtype, W, activation):
    T = conv.CU_RAGGED[-1]
    inp = conv.make_inputs(1, T, 24, W, dtype, cu=conv.CU_RAGGED, seed=W * 10 + 1)
    plan = _plan(24, W, dtype, conv.DEV, variant)
    got = conv.run_cake(inp, activation, plan=plan)
    _check(got, conv.run_reference(inp, activation), dtype)
    if dtype == torch.float32 and W == 4:
        _same_as_default(conv, inp, activation, plan, got)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype,W,activation", FIXED, ids=str)
def test_variant_parity_fixed_length(conv, variant, dtype, W, activation):
    """B = 2, T = 37, D = 72 (two channel blocks), fp32 parameters, no final state too."""
    inp = conv.make_inputs(2, 37, 72, W, dtype, seed=W + 5, param_dtype=torch.float32)
    plan = _plan(72, W, dtype, conv.DEV, variant)
    got = conv.run_cake(inp, activation, plan=plan)
    _check(got, conv.run_reference(inp, activation), dtype)
    got = conv.run_cake(inp, activation, output_final_state=False, plan=plan)
    _check(got, conv.run_reference(inp, activation, output_final_state=False), dtype,
           ofs=False)


@pytest.mark.parametrize("variant", ["window", "both"])
@pytest.mark.parametrize("block_t", [1, 2, 8])
def test_window_short_blocks_state_reaches_several(conv, variant, block_t):
    """Token blocks shorter than the W - 1 halo: the state's taps reach several blocks'
    shifts; no bias, then a bias (the window's accumulators start from it)."""
    cu = (0, 0, 2, 11)
    for bias in (False, True):
        inp = conv.make_inputs(1, cu[-1], 12, 4, cu=cu, seed=block_t, bias=bias)
        plan = _plan(12, 4, torch.float32, conv.DEV, variant, block_t_bwd=block_t,
                     block_d_bwd=4)
        got = conv.run_cake(inp, "silu", plan=plan)
        _check(got, conv.run_reference(inp, "silu"), torch.float32)
        _same_as_default(conv, inp, "silu", plan, got)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_repeats_bitwise(conv, variant):
    inp = conv.make_inputs(1, conv.CU_RAGGED[-1], 20, 4, torch.bfloat16, cu=conv.CU_RAGGED,
                           seed=11)
    plan = _plan(20, 4, torch.bfloat16, conv.DEV, variant)

    def step():
        return [v for v in conv.run_cake(inp, "silu", plan=plan).values() if v is not None]

    def noise():  # other work between repeats
        conv.run_cake(conv.make_inputs(2, 9, 20, 4, torch.bfloat16, seed=99), None)

    assert_bitwise_repeat(step, repeats=2, between=noise)


def test_variant_plan_fields():
    p = dataclasses.replace(make_plan(64, 4, torch.bfloat16, "cuda"), bwd_window=1,
                            weight_tap_major=1)
    assert CausalConv1dDetPlan.from_dict(p.to_dict()) == p
    rule = make_plan(64, 4, torch.bfloat16, "cuda")
    assert (rule.bwd_window, rule.weight_tap_major) == (0, 0)  # the rule is unchanged
    with pytest.raises(ValueError, match="kernel_size <= 4"):
        dataclasses.replace(make_plan(64, 5, torch.bfloat16, "cuda"), bwd_window=1)
    for field in ("bwd_window", "weight_tap_major"):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(rule, **{field: 2})
    old = {k: v for k, v in rule.to_dict().items() if k not in ("bwd_window",
                                                                 "weight_tap_major")}
    with pytest.raises(ValueError, match="add bwd_window = 0 and weight_tap_major = 0"):
        CausalConv1dDetPlan.from_dict({**old, "version": 1})


@pytest.mark.parametrize("W", [5, 8])
def test_tap_major_wider_kernels(conv, W):
    """W > 4 (no window there): the tap-major weight with the state's band of W - 1 slots."""
    inp = conv.make_inputs(1, 14, 8, W, cu=(0, 2, 14), seed=W)
    plan = _plan(8, W, torch.float32, conv.DEV, "tap-major")
    got = conv.run_cake(inp, "silu", plan=plan)
    _check(got, conv.run_reference(inp, "silu"), torch.float32)
    _same_as_default(conv, inp, "silu", plan, got)
