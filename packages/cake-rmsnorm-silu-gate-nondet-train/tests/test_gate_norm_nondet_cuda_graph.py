"""One forward and backward of rmsnorm_silu_gate_nondet captured in a CUDA graph (static
inputs, a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). Replays equal to eager bitwise: this
package's kernels today have no atomics; revisit if a plan adds them. The graph test needs
CUDA; the same step runs eagerly on the CPU under Triton's interpreter."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_rmsnorm_silu_gate_nondet_train import (
    RMSNormSiluGateNondetWorkspace,
    make_nondet_plan,
    rmsnorm_silu_gate_nondet,
)


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, rows, D, dtype, norm_before_gate, activation):
    """``(make_inputs, step, names)`` of one shape and variant on ``dev``."""
    plan = make_nondet_plan(D, dtype, dev)
    ws = RMSNormSiluGateNondetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        return (randn((rows, D), dtype, dev, seed=10 * seed + 1, scale=2.0),
                randn((rows, D), dtype, dev, seed=10 * seed + 2),
                randn((D,), dtype, dev, seed=10 * seed + 3),
                randn((rows, D), dtype, dev, seed=10 * seed + 4))

    def step(x, z, w, dy):
        x, z, w = (t.detach().requires_grad_() for t in (x, z, w))
        y = rmsnorm_silu_gate_nondet(x, z, w, norm_before_gate=norm_before_gate,
                                     activation=activation, plan=plan, workspace=ws)
        dx, dz, dw = torch.autograd.grad(y, (x, z, w), dy)
        return y.detach(), dx, dz, dw

    return make_inputs, step, ("y", "dx", "dz", "dweight")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("rows,D,dtype,nbg,act", [
    (300, 256, torch.bfloat16, True, "silu"),
    (77, 200, torch.float32, False, "sigmoid"),
])
def test_graph_replay_matches_eager(rows, D, dtype, nbg, act):
    make_inputs, step, names = case(torch.device("cuda"), rows, D, dtype, nbg, act)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    rows, D = 13, 100  # D not a power of two
    make_inputs, step, names = case(torch.device("cpu"), rows, D, torch.float32, False,
                                    "sigmoid")
    outs = step(*make_inputs(1))
    assert [tuple(o.shape) for o in outs] == [(rows, D), (rows, D), (rows, D), (D,)]
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
