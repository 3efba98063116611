"""One forward and backward of dense_projection_nondet captured in a CUDA graph (static
inputs, a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). Replays equal to eager bitwise: this
package's kernels today have no atomics (the CUDA rule's weight gradient comes from cuBLAS,
deterministic for equal shapes and streams); revisit if a plan adds them. The graph test
needs CUDA; the same step runs eagerly on the CPU under Triton's interpreter."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_dense_projection_nondet_gemm import (
    DenseProjectionNondetWorkspace,
    dense_projection_nondet,
    make_nondet_plan,
)


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, M, N, K, dtype):
    """``(make_inputs, step, names)`` of one shape on ``dev``."""
    plan = make_nondet_plan(M, N, K, dtype, dev)
    ws = DenseProjectionNondetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((M, K), dtype, dev, seed=10 * seed + 1),
                randn((N, K), dtype, dev, seed=10 * seed + 2, scale=K ** -0.5),
                randn((N,), dtype, dev, seed=10 * seed + 3),
                randn((M, N), dtype, dev, seed=10 * seed + 4))

    def step(x, w, b, dy):
        x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
        y = dense_projection_nondet(x, w, b, plan=plan, workspace=ws)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
        return y.detach(), dx, dw, db

    return make_inputs, step, ("y", "dx", "dweight", "dbias")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("M,N,K,dtype", [(512, 256, 384, torch.bfloat16),
                                         (100, 72, 40, torch.float32)])
def test_graph_replay_matches_eager(M, N, K, dtype):
    make_inputs, step, names = case(torch.device("cuda"), M, N, K, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    M, N, K = 37, 24, 40  # M off every block size
    make_inputs, step, names = case(torch.device("cpu"), M, N, K, torch.float32)
    outs = step(*make_inputs(1))
    assert [tuple(o.shape) for o in outs] == [(M, N), (M, K), (N, K), (N,)]
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
