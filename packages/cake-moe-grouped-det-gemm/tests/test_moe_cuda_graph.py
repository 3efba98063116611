"""One forward and backward of moe_grouped_det_gemm captured in a CUDA graph (static inputs,
a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). The expert offsets are a static
input too, with other group sizes at each replay: on a GPU the kernels read them on the
device only, so the routing may change between replays. CUDA only: skipped elsewhere."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn
from cake_moe_grouped_det_gemm import MoEGroupedDetWorkspace, make_plan, moe_grouped_det_gemm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


def case(dev, M, E, N, K, dtype):
    """``(make_inputs, step, names)`` on ``dev``: M rows, E experts of random sizes (some
    empty, some rows past the last expert) drawn per seed."""
    plan = make_plan(M, E, N, K, dtype, dev)
    ws = MoEGroupedDetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        g = torch.Generator().manual_seed(10 * seed)
        cuts = torch.randint(0, M + 1, (E,), generator=g).sort().values
        cuts[0] = 0  # the first expert empty
        return (randn((M, K), dtype, dev, seed=10 * seed + 1),
                randn((E, N, K), dtype, dev, seed=10 * seed + 2, scale=K ** -0.5),
                cuts.to(dev, torch.int32),
                randn((M, N), dtype, dev, seed=10 * seed + 3))

    def step(x, w, offs, dy):
        x, w = (t.detach().requires_grad_() for t in (x, w))
        y = moe_grouped_det_gemm(x, w, offs, plan=plan, workspace=ws)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        return y.detach(), dx, dw

    return make_inputs, step, ("y", "dx", "dweight")


@pytest.mark.parametrize("M,E,N,K,dtype", [(512, 8, 128, 256, torch.bfloat16),
                                           (100, 5, 24, 40, torch.float32)])
def test_graph_replay_matches_eager(M, E, N, K, dtype):
    make_inputs, step, names = case(torch.device("cuda"), M, E, N, K, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)
