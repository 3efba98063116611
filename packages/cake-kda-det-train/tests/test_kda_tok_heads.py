"""``tok_heads`` / ``num_warps_tok`` and ``tok_heads_bwd`` / ``num_warps_tok_bwd``: the
value heads per program and the warps of the two token-parallel kernels
(``kda_fwd_pairs_tok_kernel``, ``kda_bwd_intra_tok_kernel``). Against the float64
reference (packed documents with an empty and a 1-token one, chunks cut short, one across
a 16-token sub-chunk boundary, strong decays; head blocks that overhang the value heads,
GQA), the same math at every head block: close to the 4 x 4 plan and repeatable (the tile
sets the order of each pair's sum over K: other bits); the kernels launched with the
plan's heads and warps; the fields serialised and checked; the rule's choice."""

import dataclasses

import pytest
import torch
from cake_core.testing import randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import KDADetPlan, make_plan

DEV = default_device()
# the head blocks do not depend on the token's place in its chunk: documents across a
# 64-token chunk boundary are checked with the rule's head blocks in test_kda_parity.py
LENS = [1, 18, 0, 9]
OLD = dict(tok_heads=4, num_warps_tok=4, tok_heads_bwd=4, num_warps_tok_bwd=4)


def _plan(K, V, dtype, **over):
    return dataclasses.replace(make_plan(K, V, dtype, DEV), **over)


# tok_heads = 2 / tok_heads_bwd = 2 at HV = 3 (fp32, K = 32, V = 16): in
# test_tok_kernel_zeros_under_poison, against float64 with every empty poisoned
@pytest.mark.parametrize("K, V, dtype, H, HV, over", [
    (24, 16, torch.float32, 2, 4, dict(tok_heads=1, num_warps_tok=1, tok_heads_bwd=1,
                                       num_warps_tok_bwd=1)),
    (48, 40, torch.bfloat16, 1, 3, dict(tok_heads=8, num_warps_tok=2, tok_heads_bwd=2,
                                        num_warps_tok_bwd=4)),
    (64, 64, torch.float16, 1, 2, dict(tok_heads=2, num_warps_tok=1, tok_heads_bwd=1,
                                       num_warps_tok_bwd=1)),
], ids=["fp32-1x1-gqa", "bf16-8x2-HV3", "fp16-rule-cuda"])
def test_tok_heads_vs_reference(K, V, dtype, H, HV, over, kda):
    plan = kda.variant_plan(_plan, K, V, dtype, over)
    kda.check_plan_on_docs(plan, LENS, K, V, dtype, seed=331, H=H, HV=HV)


def test_tok_kernel_zeros_under_poison(kda):
    """The forward's token-parallel kernel at a head block that overhangs HV = 3; every
    floating ``torch.empty`` poisoned, so a zero above the diagonal that the kernel failed
    to store reaches o and the gradients as NaN (shown to fail with the zero store removed)."""
    from cake_core.testing import poisoned_empty

    over = dict(tok_heads=2, num_warps_tok=1, tok_heads_bwd=2, num_warps_tok_bwd=1)
    plan = kda.variant_plan(_plan, 32, 16, torch.float32, over)
    with poisoned_empty(floating_only=True):
        kda.check_plan_on_docs(plan, LENS, 32, 16, torch.float32, seed=347, H=1, HV=3)


def test_tok_heads_close_to_4x4_and_repeat(kda):
    """Documents of 1, 9, 0 and 5 tokens (each pair's sum over K is per token: any tokens
    show the order and the repeat)."""
    K, V = 32, 16
    lens = [1, 9, 0, 5]
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, sum(lens), 1, 3, K, V, torch.float32,
                                               seed=337, g_mode="strong",
                                               n_states=len(lens), h0=True)
    do = randn(v.shape, v.dtype, DEV, seed=338)
    dht = randn(h0.shape, torch.float32, DEV, seed=339)
    base = _plan(K, V, torch.float32, **OLD)
    new = dataclasses.replace(base, tok_heads=2, num_warps_tok=1, tok_heads_bwd=1,
                              num_warps_tok_bwd=1)
    kda.assert_repeats_and_close((q, k, v, g, beta), h0, kda.cu_of(lens), do, dht, new, base)


def test_tok_kernels_launch_as_the_plan_says(kda, monkeypatch):
    fwd = kda.spy_launches(monkeypatch, "kda_fwd_pairs_tok_kernel")
    bwd = kda.spy_launches(monkeypatch, "kda_bwd_intra_tok_kernel")
    K, V, HV = 16, 16, 3
    q, k, v, g, beta, h0 = kda.make_kda_inputs(1, 5, 1, HV, K, V, torch.float32, seed=341,
                                               n_states=1, h0=True)
    do = randn(v.shape, v.dtype, DEV, seed=342)
    for th, tw, bh, bw in ((2, 1, 1, 1), (4, 4, 4, 4), (1, 2, 8, 8)):
        fwd.clear()
        bwd.clear()
        plan = _plan(K, V, torch.float32, tok_heads=th, num_warps_tok=tw, tok_heads_bwd=bh,
                     num_warps_tok_bwd=bw)
        kda.fwd_bwd_saved((q, k, v, g, beta), h0, kda.cu_of([5]), do, None, plan)
        assert len(fwd) == 1 and len(bwd) == 1  # the backward loads the kept Aqk
        (fgrid, fkw), (bgrid, bkw) = fwd[0], bwd[0]
        assert (fgrid[1], fkw["BH"], fkw["num_warps"]) == (-(-HV // th), th, tw)
        assert (bgrid[1], bkw["BH"], bkw["num_warps"]) == (-(-HV // bh), bh, bw)


def test_tok_fields_serialised_and_checked():
    rule = make_plan(64, 64, torch.bfloat16, DEV)
    want = (2, 1, 1, 1) if DEV.type == "cuda" else (4, 4, 4, 4)  # the rule's (session 29)
    assert (rule.tok_heads, rule.num_warps_tok, rule.tok_heads_bwd,
            rule.num_warps_tok_bwd) == want
    cuda = _rule_of("cuda")
    assert (cuda.tok_heads, cuda.num_warps_tok, cuda.tok_heads_bwd,
            cuda.num_warps_tok_bwd) == (2, 1, 1, 1)
    plan = dataclasses.replace(rule, tok_heads=8, num_warps_tok=2, tok_heads_bwd=16,
                               num_warps_tok_bwd=8)
    d = plan.to_dict()
    assert d["version"] == KDADetPlan.format_version == 1
    assert (d["tok_heads"], d["num_warps_tok"], d["tok_heads_bwd"],
            d["num_warps_tok_bwd"]) == (8, 2, 16, 8)
    assert KDADetPlan.from_dict(d) == plan and plan.key != rule.key


def _rule_of(device):
    from cake_kda_det_train.plan import _rule

    return _rule(128, 128, torch.bfloat16, torch.device(device))


@pytest.mark.parametrize("over, msg", [
    (dict(tok_heads=3), "tok_heads must be a power of two"),
    (dict(tok_heads_bwd=0), "tok_heads_bwd must be a power of two"),
    (dict(tok_heads=128), r"tok_heads must be in \[1, 64\]"),
    (dict(num_warps_tok=3), "num_warps_tok"),
    (dict(num_warps_tok_bwd=64), "num_warps_tok_bwd"),
])
def test_bad_tok_fields_refused(over, msg):
    with pytest.raises(ValueError, match=msg):
        _plan(32, 32, torch.float32, **over)
