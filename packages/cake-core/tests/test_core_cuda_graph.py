"""cake_core.testing.graph_replay_matches_eager: a plain torch step passes; a step that syncs
the host fails its capture; inputs the step ignores (a replay of stale values could not be
told apart) are refused; no CUDA is refused before anything runs. The failing capture runs
last: a refused capture should leave the process usable, but nothing after it depends on
that."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _inputs(seed):
    return (randn((64, 32), torch.float32, "cuda", seed=10 * seed + 1),
            randn((16, 32), torch.float32, "cuda", seed=10 * seed + 2),
            randn((64, 16), torch.float32, "cuda", seed=10 * seed + 3))


def _step(x, w, dy):
    x, w = (t.detach().requires_grad_() for t in (x, w))
    y = torch.tanh(x @ w.T)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    return y.detach(), dx, dw


@cuda
def test_plain_step_replays_eager_bits():
    wants = graph_replay_matches_eager(_inputs, _step, names=("y", "dx", "dw"))
    assert len(wants) == 2 and len(wants[0]) == 3


@cuda
def test_inputs_the_step_ignores_are_refused():
    fixed = _inputs(7)

    with pytest.raises(AssertionError, match="same outputs"):
        graph_replay_matches_eager(_inputs, lambda x, w, dy: _step(*fixed))


@cuda
def test_host_sync_in_the_step_fails_the_capture():
    def step(x, w, dy):
        out = _step(x, w, dy)
        if float(out[0].sum()) > 1e30:  # .item(): a host sync, refused while capturing
            raise AssertionError("unreachable")
        return out

    with pytest.raises(RuntimeError):
        graph_replay_matches_eager(_inputs, step)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_without_cuda_refused():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        graph_replay_matches_eager(lambda seed: (), lambda: ())
