"""The plan's candidate kernels (``bwd_window``: the SiLU backward loads each shifted x tile
once; ``weight_tap_major``: the taps read from a ``[W, D]`` copy; ``bwd_da_once``: the SiLU
backward forms dpre once per row, persistent, with a per-program scratch) against the float64
reference on the main parity cases, bitwise repeats, the same bits as the default plan under
the interpreter (same sums in the same order), and the plan field's checks / upgrade
message."""

import dataclasses

import pytest
import torch
from cake_causal_conv1d_det_train import CausalConv1dDetPlan, make_plan
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_close_to_reference,
    bitwise_equal,
    record_launches,
)
from cake_core.triton_utils import is_interpreting

VARIANTS = {"window": dict(bwd_window=1), "tap-major": dict(weight_tap_major=1),
            "both": dict(bwd_window=1, weight_tap_major=1), "da-once": dict(bwd_da_once=1),
            "da-once-tap-major": dict(bwd_da_once=1, weight_tap_major=1)}
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
    # from the rule's tiles with the three variant flags off (the CUDA rule sets two of them)
    base = dataclasses.replace(make_plan(D, W, dtype, dev), bwd_window=0, weight_tap_major=0,
                               bwd_da_once=0)
    return dataclasses.replace(base, **VARIANTS[variant], **extra)


def _same_as_default(conv, inp, act, plan, got):
    """Under the interpreter the variant's bits equal the default plan's (compiled, fused
    multiply-adds may differ: not promised across plans)."""
    if not is_interpreting():
        return
    base = dataclasses.replace(plan, bwd_window=0, weight_tap_major=0, bwd_da_once=0)
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
                            weight_tap_major=1, bwd_da_once=0)
    assert CausalConv1dDetPlan.from_dict(p.to_dict()) == p
    rule = make_plan(64, 4, torch.bfloat16, "cpu")
    assert (rule.bwd_window, rule.weight_tap_major) == (0, 0)  # the CPU rule is unchanged
    with pytest.raises(ValueError, match="kernel_size <= 4"):
        dataclasses.replace(make_plan(64, 5, torch.bfloat16, "cuda"), bwd_window=1)
    for field in ("bwd_window", "weight_tap_major"):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(rule, **{field: 2})
    old = {k: v for k, v in rule.to_dict().items() if k not in ("bwd_window",
                                                                 "weight_tap_major",
                                                                 "bwd_da_once")}
    with pytest.raises(ValueError, match="add bwd_window = 0, weight_tap_major = 0, "
                                         "bwd_da_once = 0, fwd_sub_t = fwd_sub_t_linear = "
                                         "block_t_fwd and set version = 4"):
        CausalConv1dDetPlan.from_dict({**old, "version": 1})


@pytest.mark.parametrize("W", [5, 8])
def test_tap_major_wider_kernels(conv, W):
    """W > 4 (no window there): the tap-major weight with the state's band of W - 1 slots."""
    inp = conv.make_inputs(1, 14, 8, W, cu=(0, 2, 14), seed=W)
    plan = _plan(8, W, torch.float32, conv.DEV, "tap-major")
    got = conv.run_cake(inp, "silu", plan=plan)
    _check(got, conv.run_reference(inp, "silu"), torch.float32)
    _same_as_default(conv, inp, "silu", plan, got)


# ----------------------------------------------------------------------------- bwd_da_once


def test_da_once_plan_fields():
    rule = make_plan(64, 4, torch.bfloat16, "cuda")
    assert rule.bwd_da_once == 1  # the CUDA rule for W <= 4 since the session-13 H200 sweep
    assert make_plan(64, 5, torch.bfloat16, "cuda").bwd_da_once == 0  # W > 4: not timed
    assert make_plan(64, 4, torch.bfloat16, "cpu").bwd_da_once == 0
    for W in (2, 5, 8):  # any W (the halo tile is BW rows)
        p = dataclasses.replace(make_plan(64, W, torch.bfloat16, "cuda"), bwd_da_once=1,
                                weight_tap_major=1)
        assert CausalConv1dDetPlan.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="bwd_da_once"):
        dataclasses.replace(rule, bwd_da_once=2)
    with pytest.raises(ValueError, match="set one of them"):
        dataclasses.replace(rule, bwd_da_once=1, bwd_window=1)
    rule = dataclasses.replace(rule, bwd_da_once=0)
    v2 = {k: v for k, v in rule.to_dict().items() if k != "bwd_da_once"}
    with pytest.raises(ValueError, match="add bwd_da_once = 0, fwd_sub_t = fwd_sub_t_linear "
                                         "= block_t_fwd and set version = 4"):
        CausalConv1dDetPlan.from_dict({**v2, "version": 2})


# token block vs the W - 1 halo: equal (1, 2), (2, 3); shorter (1, 4), (2, 5), (4, 8);
# longer (32, 8). The interpreter's time grows with W / block_t: the longest pairs are left out
@pytest.mark.parametrize("block_t, W", [(1, 2), (1, 4), (2, 3), (2, 5), (4, 8), (32, 8)])
def test_da_once_short_blocks_and_widths(conv, W, block_t):
    """Token blocks shorter than the W - 1 halo (the halo rows' pre takes the state's taps;
    a tile's halo reaches past the document end into the next one), W from 2 to 8; the
    same bits as the default plan (under the interpreter), bias and none."""
    cu = (0, 0, 1, 2, 5, 11, 30)
    for bias in (False, True):
        inp = conv.make_inputs(1, cu[-1], 12, W, cu=cu, seed=block_t + W, bias=bias)
        plan = _plan(12, W, torch.float32, conv.DEV, "da-once", block_t_bwd=block_t,
                     block_d_bwd=4)
        got = conv.run_cake(inp, "silu", plan=plan)
        _check(got, conv.run_reference(inp, "silu"), torch.float32)
        _same_as_default(conv, inp, "silu", plan, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_da_once_no_state_no_bias(conv, dtype):
    """No initial state (positions before a start read 0), no bias, fixed length and packed,
    SiLU and None (None ignores the flag: the default kernel)."""
    for cu in (None, conv.CU_RAGGED):
        B, T = (3, 21) if cu is None else (1, cu[-1])
        inp = conv.make_inputs(B, T, 40, 3, dtype, cu=cu, bias=False, h0=False, seed=7)
        plan = _plan(40, 3, dtype, conv.DEV, "da-once")
        for act in ("silu", None):
            got = conv.run_cake(inp, act, plan=plan)
            _check(got, conv.run_reference(inp, act), dtype)
            if dtype == torch.float32:
                _same_as_default(conv, inp, act, plan, got)


def test_da_once_workspace_and_low_level(conv):
    """The workspace owns the scratch (``da_scratch``, one slot per program; its leading
    dim is the program count: 1 slot walks every tile); the low-level entries give the
    autograd entry's bits; a workspace without the scratch is refused before any launch."""
    from cake_causal_conv1d_det_train import (
        CausalConv1dDetWorkspace,
        causal_conv1d_det_bwd,
        causal_conv1d_det_fwd,
    )
    from cake_causal_conv1d_det_train.saved import da_scratch_shape

    inp = conv.make_inputs(1, conv.CU_RAGGED[-1], 20, 4, torch.bfloat16, cu=conv.CU_RAGGED,
                           seed=3)
    plan = _plan(20, 4, torch.bfloat16, conv.DEV, "da-once")
    want = conv.run_cake(inp, "silu", plan=plan)
    T = conv.CU_RAGGED[-1]
    ws = CausalConv1dDetWorkspace.for_plan(plan, conv.DEV, max_tokens=T, max_seqs=6)
    assert tuple(ws["da_scratch"].shape[1:]) == da_scratch_shape(plan, 1)[1:]
    got = conv.run_cake(inp, "silu", plan=plan, workspace=ws)
    for k, v in got.items():
        if v is not None:
            assert bitwise_equal(v, want[k]), k
    one = CausalConv1dDetWorkspace(plan, conv.DEV, {
        "dweight_partials": ws["dweight_partials"], "dbias_partials": ws["dbias_partials"],
        "da_scratch": torch.empty(da_scratch_shape(plan, 1), device=conv.DEV)})
    _, _, saved = causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, activation="silu",
                                        cu_seqlens=inp.cu, initial_state=inp.h0,
                                        output_final_state=True, plan=plan)
    gr = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved, workspace=one)
    for k, v in zip(("dx", "dweight", "dbias", "dh0"), gr, strict=True):
        assert bitwise_equal(v, want[k]), k
    base = dataclasses.replace(make_plan(20, 4, torch.bfloat16, conv.DEV), bwd_da_once=0)
    plain = CausalConv1dDetWorkspace.for_plan(base, conv.DEV, max_tokens=T, max_seqs=6)
    assert "da_scratch" not in plain.names
    bad = CausalConv1dDetWorkspace(plan, conv.DEV, {
        "dweight_partials": ws["dweight_partials"], "dbias_partials": ws["dbias_partials"]})
    with pytest.raises(ValueError, match="da_scratch"):
        causal_conv1d_det_bwd(inp.dy, inp.dfs, saved, workspace=bad)


def test_da_once_custom_op_path(conv):
    """The ``::bwd`` custom op (what torch.compile traces) with the variant's plan fields:
    the scratch is allocated per call there; the same bits as the default plan's fields
    (under the interpreter) and near float64."""
    import cake_causal_conv1d_det_train.api as api

    cu = (0, 0, 2, 19, 30)
    inp = conv.make_inputs(1, cu[-1], 12, 4, cu=cu, seed=5)
    plan = _plan(12, 4, torch.float32, conv.DEV, "da-once")
    outs = {}
    for name, p in (("once", plan), ("base", dataclasses.replace(plan, bwd_da_once=0))):
        outs[name] = torch.ops.cake_causal_conv1d_det_train.bwd(
            inp.dy, inp.dfs, inp.x, inp.weight, inp.bias, inp.h0, inp.cu, 1,
            api.plan_to_op_fields(p), None, None)
    ref = conv.run_reference(inp, "silu")
    for k, a, b in zip(("dx", "dweight", "dbias", "dh0"), outs["once"], outs["base"],
                       strict=True):
        assert_close_to_reference(a, ref[k], torch.float32, k)
        if is_interpreting():
            assert bitwise_equal(a, b), k


@pytest.mark.parametrize("sub_t", [1, 2, 8])
@pytest.mark.parametrize("dtype,W,activation", [(torch.float32, 4, "silu"),
                                                (torch.bfloat16, 3, None)], ids=str)
def test_forward_sub_tiles_same_bits(conv, sub_t, dtype, W, activation):
    """The forward's token block in sub-tiles of ``plan.fwd_sub_t`` (SiLU) /
    ``plan.fwd_sub_t_linear`` (no activation) rows (kernels/fwd.py): the same y and final
    state bits as the whole block, packed (the initial state reaching several sub-tiles
    when they are shorter than W - 1) and fixed length (a partial block); and near
    float64. The field of the other activation has no effect."""
    T = conv.CU_RAGGED[-1]
    field, other = ("fwd_sub_t", "fwd_sub_t_linear") if activation else \
        ("fwd_sub_t_linear", "fwd_sub_t")
    for inp in (conv.make_inputs(1, T, 20, W, dtype, cu=conv.CU_RAGGED, seed=sub_t),
                conv.make_inputs(2, 21, 20, W, dtype, seed=sub_t + 1)):
        whole = dataclasses.replace(make_plan(20, W, dtype, conv.DEV), block_t_fwd=16,
                                    fwd_sub_t=16, fwd_sub_t_linear=16)
        want = conv.run_cake(inp, activation, plan=whole)
        got = conv.run_cake(inp, activation, plan=dataclasses.replace(whole, **{field: sub_t}))
        for k in ("y", "fs"):
            assert bitwise_equal(got[k], want[k]), k
        _check(got, conv.run_reference(inp, activation), dtype)
    if sub_t == 1:  # the other activation's field leaves this launch alone
        with_other = dataclasses.replace(whole, **{other: 1})
        assert bitwise_equal(conv.run_cake(inp, activation, plan=with_other)["y"], want["y"])


def test_sub_tile_field_reaches_the_launch(conv, monkeypatch):
    """The launch's SUB_T is min(block_t_fwd, fwd_sub_t) with SiLU and min(block_t_fwd,
    fwd_sub_t_linear) without (every value gives the same bits, so only the launch shows
    which field was read); the CUDA rule's choice for W <= 4 is 64 / 32."""
    from cake_causal_conv1d_det_train import api

    inp = conv.make_inputs(1, 40, 20, 4, torch.float32, seed=4)
    plan = dataclasses.replace(make_plan(20, 4, torch.float32, conv.DEV), block_t_fwd=16,
                               fwd_sub_t=4, fwd_sub_t_linear=2)
    with record_launches(api, "causal_conv1d_fwd_kernel") as launches:
        conv.run_cake(inp, "silu", plan=plan)
        conv.run_cake(inp, None, plan=plan)
        conv.run_cake(inp, None, plan=dataclasses.replace(plan, fwd_sub_t_linear=64))
    assert [kw["SUB_T"] for _, kw in launches["causal_conv1d_fwd_kernel"]] == [4, 2, 16]
    rule = make_plan(4096, 4, torch.bfloat16, "cuda")
    assert (rule.block_t_fwd, rule.fwd_sub_t, rule.fwd_sub_t_linear) == (64, 64, 32)
    wide = make_plan(4096, 5, torch.bfloat16, "cuda")  # W > 4: not timed, whole blocks
    assert wide.fwd_sub_t == wide.fwd_sub_t_linear == wide.block_t_fwd


def test_sub_tile_fields_checked(conv):
    """fwd_sub_t / fwd_sub_t_linear: powers of two (min(value, block_t_fwd) rows are used:
    a larger value is the whole block, the same bits); a format-3 dict is refused and told
    what to add."""
    plan = make_plan(64, 4, torch.float32, "cpu")
    for field in ("fwd_sub_t", "fwd_sub_t_linear"):
        for bad, msg in ((3, "power of two"), (0, "power of two")):
            with pytest.raises(ValueError, match=msg):
                dataclasses.replace(plan, **{field: bad})
    inp = conv.make_inputs(1, 40, 64, 4, torch.float32, seed=3)
    big = dataclasses.replace(plan, fwd_sub_t=1 << 12, fwd_sub_t_linear=1 << 12)
    for act in ("silu", None):
        assert bitwise_equal(conv.run_cake(inp, act, plan=big)["y"],
                             conv.run_cake(inp, act, plan=plan)["y"])
    d = plan.to_dict()
    del d["fwd_sub_t"], d["fwd_sub_t_linear"]
    d["version"] = 3
    with pytest.raises(ValueError, match="fwd_sub_t = fwd_sub_t_linear = block_t_fwd"):
        type(plan).from_dict(d)
