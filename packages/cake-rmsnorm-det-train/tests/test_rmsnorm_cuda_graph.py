"""One forward and backward of rmsnorm_det captured in a CUDA graph (static inputs, a static
workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). CUDA only: skipped elsewhere."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn
from cake_rmsnorm_det_train import RMSNormDetWorkspace, make_plan, rmsnorm_det

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


def case(dev, rows, H, dtype):
    """``(make_inputs, step, names)`` of one shape on ``dev``."""
    plan = make_plan(H, dtype, dev)
    ws = RMSNormDetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((rows, H), dtype, dev, seed=10 * seed + 1, scale=3.0),
                randn((H,), dtype, dev, seed=10 * seed + 2),
                randn((rows, H), dtype, dev, seed=10 * seed + 3))

    def step(x, w, dy):
        x, w = (t.detach().requires_grad_() for t in (x, w))
        y = rmsnorm_det(x, w, plan=plan, workspace=ws)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        return y.detach(), dx, dw

    return make_inputs, step, ("y", "dx", "dweight")


@pytest.mark.parametrize("rows,H,dtype", [(300, 256, torch.bfloat16), (77, 1000, torch.float32)])
def test_graph_replay_matches_eager(rows, H, dtype):
    make_inputs, step, names = case(torch.device("cuda"), rows, H, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)
