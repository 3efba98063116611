"""``plan.diag_load`` 1 (the intra-sub-chunk partner rows loaded from memory instead of
selected out of the register tile), 2 (also the backward's dA / dAqk entries, from an
fp32 copy), ``plan.bwd_split`` (the pair products' gradients in a kernel per 16-token
sub-chunk) and ``plan.fwd_split`` (the pair products themselves, likewise): o,
final_state and every gradient against the float64 reference (packed 1/70/0/65-token
documents, HV = 2H, strong per-channel decays, kept and recomputed T, K and V off the
block sizes); diag_load gives the default path's values (each sub-chunk term is the same
product, summed in the same order; the splits sum in another order); bitwise repeatable;
the fields are part of the plan's serialised form (format version 3, now 4) and checked."""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_bitwise_repeat, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan
from cake_kda_det_train.plan import cuda_plan_problem

DEV = default_device()
LENS = [1, 70, 0, 65]


@pytest.mark.parametrize("K, V, dtype, over", [
    (48, 32, torch.float32, dict(block_k_inner=32, diag_load=2)),
    (40, 32, torch.float32, dict(block_k_inner=16, keep_a=0, keep_aqk=0, diag_load=1, bwd_split=1)),
    (64, 64, torch.bfloat16, dict(block_k_inner=32, diag_load=2, bwd_split=1)),
    (40, 32, torch.float32, dict(block_k_inner=16, keep_a=0, keep_aqk=0, fwd_split=1)),
    (64, 64, torch.bfloat16, dict(block_k_inner=32, fwd_split=1, bwd_split=1)),
], ids=["fp32-bki32-level2", "fp32-bki16-recompute-level1-split", "bf16-64-level2-split",
        "fp32-bki16-recompute-fwdsplit", "bf16-64-fwdsplit-split"])
def test_diag_load_vs_reference(K, V, dtype, over, kda):
    """Packed documents of 1, 70, 0 and 65 tokens (a chunk ending inside a sub-chunk, an
    empty document), HV = 2H, an initial state, decays down to -20 per token; K = 48 in
    blocks of 32 and K = 40 in blocks of 16 end in a partly and a fully masked block."""
    plan = dataclasses.replace(make_plan(K, V, dtype, DEV), **over)
    if DEV.type == "cuda" and dtype == torch.float32 and plan.block_k_inner == 16:
        # the fp32 cases in key blocks of 16: refused on CUDA by design (an illegal memory
        # access of the compiled backward on an H200); they run under the interpreter
        why = cuda_plan_problem(plan, dtype)
        assert why is not None and "block_k_inner >= 32" in why
        pytest.skip(f"plan refused on CUDA by design: {why}")
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=61, fp32_grad_tol=None)


def test_diag_load_same_values_as_default_and_repeats(kda):
    """Levels 1 and 2 give the default path's values (``torch.equal`` under the interpreter:
    only the sign of a zero may differ; close on a GPU) for o, final state, the saved G
    and T and every gradient; level 2 repeats bitwise."""
    K, V = 24, 16  # one partly masked key block
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, seed=63,
                                               g_mode="strong", n_states=len(LENS), h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, torch.float32, DEV, seed=64)
    dht = randn(h0.shape, torch.float32, DEV, seed=65)
    base = dataclasses.replace(make_plan(K, V, torch.float32, DEV), diag_load=0)  # any rule
    want = kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, base)
    for level in (1, 2):
        new = dataclasses.replace(base, diag_load=level)
        fn = lambda new=new: kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, new)  # noqa: E731
        got = assert_bitwise_repeat(fn, repeats=2) if level == 2 else fn()
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert (a is None) == (b is None), (level, i)
            if a is not None and DEV.type == "cpu":
                assert torch.equal(a, b), (level, i)
            elif a is not None:  # compiled: the elementwise code may round differently
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_splits_repeat_bitwise(kda):
    """bf16 in key blocks of 16 with 16-bit intermediates, packed 1/70/0/65, HV = 2H: o,
    final state, the saved G and T and every gradient, twice, the same bits. K = V = the
    smallest size whose plan stores 16-bit intermediates: 32 under the interpreter (two key
    blocks), 64 on CUDA (its rule stores them from block_k >= 64, and it refuses key blocks
    of 16 with fp32 intermediates)."""
    K = V = next(n for n in (32, 64) if make_plan(n, n, torch.bfloat16, DEV).store_16bit)
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(LENS), 1, 2, K, V, torch.bfloat16,
                                               seed=66, g_mode="strong", n_states=len(LENS),
                                               h0=True)
    cu = kda.cu_of(LENS)
    do = randn(v.shape, torch.bfloat16, DEV, seed=67)
    dht = randn(h0.shape, torch.float32, DEV, seed=68)
    plan = dataclasses.replace(make_plan(K, V, torch.bfloat16, DEV), block_k_inner=16,
                               bwd_split=1, fwd_split=1, diag_load=2)
    assert plan.store_16bit == 1
    assert_bitwise_repeat(lambda: kda.fwd_bwd_saved((q, k, v, g, beta), h0, cu, do, dht, plan),
                          repeats=2)


def test_new_fields_serialised_and_checked():
    # from a plan with diag_load, bwd_split and fwd_split 0 (the rule may choose others
    # on CUDA: the choice is the plan tests' business, the fields' form is this one's)
    plan = dataclasses.replace(make_plan(128, 128, torch.bfloat16, DEV), diag_load=0,
                               bwd_split=0, fwd_split=0, keep_aqk=0)
    on = dataclasses.replace(plan, diag_load=1)
    d = on.to_dict()
    assert d["diag_load"] == 1 and d["version"] == KDADetPlan.format_version
    assert KDADetPlan.from_dict(d) == on and on.key != plan.key
    old = {n: x for n, x in plan.to_dict().items() if n != "diag_load"}
    old["version"] = 2  # a plan serialised before the field existed
    with pytest.raises(ValueError, match="format version 2"):
        KDADetPlan.from_dict(old)
    assert KDADetPlan.from_dict(dataclasses.replace(plan, diag_load=2).to_dict()).diag_load == 2
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="diag_load"):
            dataclasses.replace(plan, diag_load=bad)
    split = dataclasses.replace(plan, bwd_split=1,
                                num_warps_intra=2 if plan.num_warps_intra != 2 else 4)
    assert split.key != plan.key
    assert KDADetPlan.from_dict(split.to_dict()) == split
    with pytest.raises(ValueError, match="bwd_split"):
        dataclasses.replace(plan, bwd_split=2)
    with pytest.raises(ValueError, match="fwd_split"):
        dataclasses.replace(plan, fwd_split=2)
    fs = dataclasses.replace(plan, fwd_split=1)
    assert KDADetPlan.from_dict(fs.to_dict()) == fs
    with pytest.raises(ValueError, match="num_warps_intra"):
        dataclasses.replace(plan, num_warps_intra=3)


def test_cuda_rule_splits_with_in_kernel_options_vs_reference(kda):
    """The CUDA rule's split paths (fwd_split, bwd_split, diag_load = 2) with every
    in-kernel option at once (q/k L2 norm, gate from A_log and dt_bias with a lower bound,
    beta sigmoid), packed 37/0/53 with an initial state, against float64."""
    lens = [37, 0, 53]
    K = V = 16
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 2, K, V, seed=71,
                                               g_mode="raw", raw_beta=True,
                                               n_states=len(lens), h0=True)
    A_log, dt_bias = kda.make_gate_params(2, K, seed=72)
    plan = dataclasses.replace(make_plan(K, V, torch.float32, DEV), fwd_split=1,
                               bwd_split=1, diag_load=2)
    kda.check_vs_reference((q, k, v, g, beta), h0, A_log, dt_bias, seed=71,
                           cu_seqlens=kda.cu_of(lens), plan=plan, use_qk_l2norm_in_kernel=True,
                           use_gate_in_kernel=True, lower_bound=-3.0,
                           use_beta_sigmoid_in_kernel=True)
