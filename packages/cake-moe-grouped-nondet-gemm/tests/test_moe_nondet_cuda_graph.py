"""One forward and backward of moe_grouped_nondet_gemm captured in a CUDA graph (static
inputs, a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). The expert offsets are a static
input too, with other group sizes at each replay: on a GPU the kernels read them on the
device only, so the routing may change between replays. Replays equal to eager bitwise:
this package's kernels today have no atomics; revisit if a plan adds them. The graph test
needs CUDA; the same step runs eagerly on the CPU under Triton's interpreter."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_moe_grouped_nondet_gemm import (
    MoEGroupedNondetWorkspace,
    make_nondet_plan,
    moe_grouped_nondet_gemm,
)


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, M, E, N, K, dtype):
    """``(make_inputs, step, names)`` on ``dev``: M rows, E experts of random sizes (some
    empty, some rows past the last expert) drawn per seed."""
    plan = make_nondet_plan(M, E, N, K, dtype, dev)
    ws = MoEGroupedNondetWorkspace.for_plan(plan, dev)

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
        y = moe_grouped_nondet_gemm(x, w, offs, plan=plan, workspace=ws)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        return y.detach(), dx, dw

    return make_inputs, step, ("y", "dx", "dweight")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("M,E,N,K,dtype", [(512, 8, 128, 256, torch.bfloat16),
                                           (100, 5, 24, 40, torch.float32)])
def test_graph_replay_matches_eager(M, E, N, K, dtype):
    make_inputs, step, names = case(torch.device("cuda"), M, E, N, K, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    M, E, N, K = 37, 3, 24, 40
    make_inputs, step, names = case(torch.device("cpu"), M, E, N, K, torch.float32)
    outs = step(*make_inputs(1))
    assert [tuple(o.shape) for o in outs] == [(M, N), (M, K), (E, N, K)]
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
