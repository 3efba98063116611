"""One forward and backward of rmsnorm_nondet captured in a CUDA graph (static inputs, a
static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). Replays equal to eager bitwise: this
package's kernels today have no atomics; revisit if a plan adds them. The graph test needs
CUDA; the same step runs eagerly on the CPU under Triton's interpreter."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_rmsnorm_nondet_train import RMSNormNondetWorkspace, make_nondet_plan, rmsnorm_nondet


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, rows, H, dtype):
    """``(make_inputs, step, names)`` of one shape on ``dev``."""
    plan = make_nondet_plan(H, dtype, dev)
    ws = RMSNormNondetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((rows, H), dtype, dev, seed=10 * seed + 1, scale=3.0),
                randn((H,), dtype, dev, seed=10 * seed + 2),
                randn((rows, H), dtype, dev, seed=10 * seed + 3))

    def step(x, w, dy):
        x, w = (t.detach().requires_grad_() for t in (x, w))
        y = rmsnorm_nondet(x, w, plan=plan, workspace=ws)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        return y.detach(), dx, dw

    return make_inputs, step, ("y", "dx", "dweight")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("rows,H,dtype", [(300, 256, torch.bfloat16), (77, 1000, torch.float32)])
def test_graph_replay_matches_eager(rows, H, dtype):
    make_inputs, step, names = case(torch.device("cuda"), rows, H, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    rows, H = 13, 100  # H not a power of two
    make_inputs, step, names = case(torch.device("cpu"), rows, H, torch.float32)
    outs = step(*make_inputs(1))
    assert [tuple(o.shape) for o in outs] == [(rows, H), (rows, H), (H,)]
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
