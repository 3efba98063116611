"""One forward and backward of an mHC layer (mhc_nondet_prepare, a branch,
mhc_nondet_finish) captured in a CUDA graph (static inputs, a static workspace) and replayed
bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`). Replays equal to eager bitwise: this
package's kernels today have no atomics; revisit if a plan adds them. The graph test needs
CUDA; the same step runs eagerly on the CPU under Triton's interpreter."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_mhc_nondet_train import (
    MHCNondetWorkspace,
    make_nondet_plan,
    mhc_nondet_finish,
    mhc_nondet_prepare,
)


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, lead, n, C, dtype):
    """``(make_inputs, step, names)`` on ``dev``: X ``[*lead, n, C]``."""
    M = 2 * n + n * n
    plan = make_nondet_plan(n, C, dtype, dev)
    ws = MHCNondetWorkspace.for_plan(plan, dev)

    def make_inputs(seed):
        s = 10 * seed
        return (randn((*lead, n, C), dtype, dev, seed=s + 1),
                randn((n * C, M), torch.float32, dev, seed=s + 2, scale=2 * (n * C) ** -0.5),
                1.0 + 0.2 * randn((3,), torch.float32, dev, seed=s + 3),
                randn((M,), torch.float32, dev, seed=s + 4, scale=0.5),
                randn((C, C), torch.float32, dev, seed=s + 5, scale=C ** -0.5),
                randn((*lead, n, C), dtype, dev, seed=s + 6))

    def step(X, phi, alpha, bias, W, dY):
        X, phi, alpha, bias = (t.detach().requires_grad_() for t in (X, phi, alpha, bias))
        U, handle = mhc_nondet_prepare(X, phi, alpha, bias, plan=plan, workspace=ws)
        B = torch.tanh(U.float() @ W).to(U.dtype)  # the branch, outside the kernels
        Y = mhc_nondet_finish(X, B, handle)
        grads = torch.autograd.grad(Y, (X, phi, alpha, bias), dY)
        return (U.detach(), Y.detach(), *grads)

    return make_inputs, step, ("U", "Y", "dX", "dphi", "dalpha", "dbias")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("lead,n,C,dtype", [((100,), 4, 64, torch.bfloat16),
                                            ((2, 33), 2, 40, torch.float32)])
def test_graph_replay_matches_eager(lead, n, C, dtype):
    make_inputs, step, names = case(torch.device("cuda"), lead, n, C, dtype)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    lead, n, C = (2, 5), 2, 40
    make_inputs, step, names = case(torch.device("cpu"), lead, n, C, torch.float32)
    outs = step(*make_inputs(1))
    M = 2 * n + n * n
    want = [(*lead, C), (*lead, n, C), (*lead, n, C), (n * C, M), (3,), (M,)]
    assert [tuple(o.shape) for o in outs] == want
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
