"""Plan format 10: ``inv_kernel`` / ``num_warps_inv``, the forward's T = (I + A)^-1 in a
kernel of its own (``kda_fwd_inv_kernel``) before the prep, which then loads it. 1 = the
prep's own whole-tile inverse there (the same bits as 0); 2 = the 16 x 16 diagonal blocks
inverted apart and merged block by block (FLA's ``solve_tril`` order; other bits). On an
H200 (session 21, case b) the forward's prep went 913 us -> 329 us with the inverse apart
(2: 117 us, 2 warps). Against the float64 reference (packed documents with an empty and a
1-token one, chunks cut short inside every 16-row block, strong decays, kept and
recomputed T); 1 bitwise equal to 0; 2 close to 0 and repeatable; the kernel launched only
when asked (and with ``fwd_split = 1``), with the plan's mode and warps; the fields
serialised, checked, a format-9 dict refused with its upgrade; the rule's choice."""

import dataclasses

import pytest
import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan
from cake_kda_det_train.plan import _rule, plan_variant

DEV = default_device()
LENS = [1, 70, 0, 65]
#: chunks that end after 1, 17, 33 and 49 rows: a partial row block at every block index
LENS_BLOCKS = [1, 64 + 17, 33, 49]


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **over)


@pytest.mark.parametrize("K, V, dtype, lens, over", [
    (24, 16, torch.float32, LENS, dict(inv_kernel=2, block_k_inner=16)),
    (24, 16, torch.float32, LENS_BLOCKS, dict(inv_kernel=2, keep_a=0, keep_aqk=0,
                                              block_k_inner=16)),
    (24, 16, torch.float32, LENS, dict(inv_kernel=1, inv_blocked=0, num_warps_inv=1)),
    (32, 32, torch.bfloat16, LENS_BLOCKS, dict(inv_kernel=2, num_warps_inv=4)),
    (48, 40, torch.float16, LENS, dict(inv_kernel=1, num_warps_inv=8)),
], ids=["2-fp32", "2-fp32-recompute-blocks", "1-fp32-whole-tile", "2-bf16-blocks",
        "1-fp16"])
def test_inv_kernel_vs_reference(K, V, dtype, lens, over, kda):
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    kda.check_plan_on_docs(plan, lens, K, V, dtype, seed=301)


def _inputs(kda, lens, K, V, seed, dtype=torch.float32):
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 2, K, V, dtype, seed=seed,
                                               g_mode="strong", n_states=len(lens), h0=True)
    do = randn(v.shape, v.dtype, DEV, seed=seed + 1)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 2)
    return (q, k, v, g, beta), h0, kda.cu_of(lens), do, dht


@pytest.mark.parametrize("inv_blocked", [0, 1])
@pytest.mark.parametrize("K, V, dtype", [(24, 16, torch.float32), (48, 40, torch.bfloat16)],
                         ids=["fp32", "bf16-16bit-T"])
def test_inv_kernel_1_keeps_the_bits_of_0(inv_blocked, K, V, dtype, kda):
    """Mode 1 runs the prep's own inverse (as inv_blocked says) in the new kernel and rounds
    T as the prep does (twice: the interpreter's fp32 -> bf16 cast of subnormals is not
    idempotent, a breaker found T's subnormal entries differing after one cast): every
    output, the saved T and every gradient bitwise equal to the prep's inverse."""
    inputs, h0, cu, do, dht = _inputs(kda, LENS_BLOCKS, K, V, 303, dtype)
    base = _plan(K, V, dtype, inv_kernel=0, inv_blocked=inv_blocked)
    want = kda.fwd_bwd_saved(inputs, h0, cu, do, dht, base)
    got = kda.fwd_bwd_saved(inputs, h0, cu, do, dht,
                            dataclasses.replace(base, inv_kernel=1))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert torch.equal(a, b), i


def test_inv_kernel_2_close_to_0_and_repeats(kda):
    K, V = 24, 16
    inputs, h0, cu, do, dht = _inputs(kda, LENS_BLOCKS, K, V, 307)
    new = _plan(K, V, torch.float32, inv_kernel=2,
                block_k_inner=16 if DEV.type == "cpu" else 32)
    kda.assert_repeats_and_close(inputs, h0, cu, do, dht, new,
                                 dataclasses.replace(new, inv_kernel=0))


def test_inv_kernel_launches_as_the_plan_says(kda, monkeypatch):
    """The inverse kernel runs once per forward with the plan's mode and warps (and in a
    backward that recomputes T), never with inv_kernel = 0; the prep then loads T."""
    inv = kda.spy_launches(monkeypatch, "kda_fwd_inv_kernel")
    prep = kda.spy_launches(monkeypatch, "kda_fwd_prep_kernel")
    K, V = 16, 16
    inputs, h0, cu, do, _ = _inputs(kda, [21], K, V, 311)
    base = make_plan(K, V, torch.float32, DEV)
    for over, n_inv in ((dict(inv_kernel=0), 0), (dict(inv_kernel=1, num_warps_inv=1), 1),
                        (dict(inv_kernel=2, num_warps_inv=2), 1),
                        (dict(inv_kernel=2, keep_a=0, keep_aqk=0), 2),
                        (dict(inv_kernel=2, fwd_split=0, keep_aqk=0), 0)):
        inv.clear()
        prep.clear()
        plan = dataclasses.replace(base, **over)
        kda.fwd_bwd_saved(inputs, h0, cu, do, None, plan)
        assert len(inv) == n_inv, over
        assert all(kw["MODE"] == plan.inv_kernel and kw["num_warps"] == plan.num_warps_inv
                   for _, kw in inv), over
        load_a = [kw["LOAD_A"] for _, kw in prep]
        assert load_a == ([True, True] if n_inv else [False, True]), over


def test_format_10_fields_serialised_and_checked():
    rule = make_plan(64, 64, torch.bfloat16, DEV)
    assert (rule.inv_kernel, rule.num_warps_inv) == (2, 2)  # the rule's (session 21)
    plan = dataclasses.replace(rule, inv_kernel=1, num_warps_inv=8)
    d = plan.to_dict()
    assert d["version"] == KDADetPlan.format_version == 1
    assert (d["inv_kernel"], d["num_warps_inv"]) == (1, 8)
    assert KDADetPlan.from_dict(d) == plan and plan.key != rule.key
    for name, bad in (("inv_kernel", 3), ("inv_kernel", -1), ("inv_kernel", True),
                      ("num_warps_inv", 3), ("num_warps_inv", 0)):
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(rule, **{name: bad})
    # used only with fwd_split: a plan without it keeps the field and never launches it
    assert plan_variant(rule, fwd_split=0).inv_kernel == 2


def test_rule_inv_kernel_and_prep_warps():
    """inv_kernel = 2 with 2 warps everywhere (the interpreter runs the GPU's path); the
    prep without the inverse 4 warps with 16-bit intermediates on CUDA (H200, case b: 329
    -> 287 us), 8 with fp32 ones at K >= 32 as before."""
    cuda = torch.device("cuda")
    for dev in ("cpu", "cuda"):
        for dt in (torch.float32, torch.bfloat16):
            for K, V in ((16, 16), (48, 40), (128, 128)):
                p = _rule(K, V, dt, torch.device(dev))
                assert (p.inv_kernel, p.num_warps_inv) == (2, 2), (dev, dt, K, V)
    assert _rule(128, 128, torch.bfloat16, cuda).num_warps_prep == 4
    assert _rule(128, 128, torch.float32, cuda).num_warps_prep == 8
    assert _rule(32, 32, torch.bfloat16, cuda).num_warps_prep == 8
