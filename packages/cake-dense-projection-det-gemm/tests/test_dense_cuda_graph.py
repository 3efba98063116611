"""One forward and backward of dense_projection_det captured in a CUDA graph (static inputs,
a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). CUDA only: skipped elsewhere."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn
from cake_dense_projection_det_gemm import (
    DenseProjectionDetWorkspace,
    dense_projection_det,
    make_plan,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


def case(dev, M, N, K, dtype):
    """``(make_inputs, step, names)`` of one shape on ``dev``."""
    plan = make_plan(M, N, K, dtype, dev)
    ws = DenseProjectionDetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((M, K), dtype, dev, seed=10 * seed + 1),
                randn((N, K), dtype, dev, seed=10 * seed + 2, scale=K ** -0.5),
                randn((N,), dtype, dev, seed=10 * seed + 3),
                randn((M, N), dtype, dev, seed=10 * seed + 4))

    def step(x, w, b, dy):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        y = dense_projection_det(x, w, b, plan=plan, workspace=ws)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        return y.detach(), dx, dw, db

    return make_inputs, step, ("y", "dx", "dweight", "dbias")


@pytest.mark.parametrize("M,N,K,dtype", [(512, 256, 384, torch.bfloat16),
                                         (100, 72, 40, torch.float32)])
def test_graph_replay_matches_eager(M, N, K, dtype):
    make_inputs, step, names = case(torch.device("cuda"), M, N, K, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)
