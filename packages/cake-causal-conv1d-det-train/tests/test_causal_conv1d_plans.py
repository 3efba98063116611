"""Non-default plans against the float64 reference: token blocks shorter than the W - 1 halo
(the state reaches several blocks), channel blocks narrower than D, and forward / backward
blockings that differ."""

import dataclasses

import pytest
import torch
from cake_causal_conv1d_det_train import CausalConv1dDetWorkspace, make_plan
from cake_core.testing import assert_close_to_reference

VARIANTS = {  # block_t_fwd, block_d_fwd, block_t_bwd, block_d_bwd
    "t1-d4": (1, 4, 1, 4),
    "t2-d8": (2, 8, 2, 8),
    "fwd-t2-bwd-t8": (2, 16, 8, 4),
    "t4-d16-warps": (4, 16, 4, 16),
}
CU = (0, 0, 2, 11)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plan_variant_matches_float64(conv, variant):
    tf, df, tb, db = VARIANTS[variant]
    D, W = 12, 4
    plan = dataclasses.replace(make_plan(D, W, torch.float32, conv.DEV), block_t_fwd=tf,
                               block_d_fwd=df, block_t_bwd=tb, block_d_bwd=db,
                               num_warps_fwd=2 if variant.endswith("warps") else 1)
    ws = CausalConv1dDetWorkspace.for_plan(plan, conv.DEV, max_tokens=CU[-1], max_seqs=3)
    inp = conv.make_inputs(1, CU[-1], D, W, cu=CU, seed=tf * 10 + tb)
    got = conv.run_cake(inp, "silu", plan=plan, workspace=ws)
    ref = conv.run_reference(inp, "silu")
    for name in ("y", "dx", "dweight", "dbias", "dh0"):
        assert_close_to_reference(got[name], ref[name], torch.float32, name)
    assert torch.equal(got["fs"], ref["fs"].float())
