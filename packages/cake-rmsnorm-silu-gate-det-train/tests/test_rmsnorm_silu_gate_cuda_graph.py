"""One forward and backward of rmsnorm_silu_gate_det captured in a CUDA graph (static inputs,
a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). CUDA only: skipped elsewhere."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetWorkspace,
    make_plan,
    rmsnorm_silu_gate_det,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


def case(dev, rows, D, dtype, norm_before_gate, activation):
    """``(make_inputs, step, names)`` of one shape and variant on ``dev``."""
    plan = make_plan(D, dtype, dev)
    ws = RMSNormSiluGateDetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((rows, D), dtype, dev, seed=10 * seed + 1, scale=2.0),
                randn((rows, D), dtype, dev, seed=10 * seed + 2),
                randn((D,), dtype, dev, seed=10 * seed + 3),
                randn((rows, D), dtype, dev, seed=10 * seed + 4))

    def step(x, z, w, dy):
        x, z, w = (t.detach().requires_grad_() for t in (x, z, w))
        y = rmsnorm_silu_gate_det(x, z, w, norm_before_gate=norm_before_gate,
                                  activation=activation, plan=plan, workspace=ws)
        dx, dz, dw = torch.autograd.grad(y, (x, z, w), dy)
        return y.detach(), dx, dz, dw

    return make_inputs, step, ("y", "dx", "dz", "dweight")


@pytest.mark.parametrize("rows,D,dtype,nbg,act", [
    (300, 256, torch.bfloat16, True, "silu"),
    (77, 200, torch.float32, False, "sigmoid"),
])
def test_graph_replay_matches_eager(rows, D, dtype, nbg, act):
    make_inputs, step, names = case(torch.device("cuda"), rows, D, dtype, nbg, act)
    graph_replay_matches_eager(make_inputs, step, names=names)
