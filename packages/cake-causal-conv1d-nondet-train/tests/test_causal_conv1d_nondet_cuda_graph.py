"""One forward and backward of causal_conv1d_nondet captured in a CUDA graph (static inputs,
a static workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`): fixed length with an initial and a
final state, and packed ragged documents (one empty, one of length 1), whose ``cu_seqlens``
stays one unchanged tensor (its values are read on the host once, before the capture).
Replays equal to eager bitwise: this package's kernels today have no atomics; revisit if a
plan adds them. The graph test needs CUDA; the same step runs eagerly on the CPU under
Triton's interpreter."""

import pytest
import torch
from cake_causal_conv1d_nondet_train import (
    CausalConv1dNondetWorkspace,
    causal_conv1d_nondet,
    make_nondet_plan,
)
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, B, T, D, W, dtype, lens=None):
    """``(make_inputs, step, names)`` on ``dev``: B rows of T tokens, or (``lens``) one packed
    row of documents of those lengths."""
    cu = None
    if lens is not None:
        B, T = 1, sum(lens)
        cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(dev, torch.int32)
    N = B if cu is None else len(lens)
    plan = make_nondet_plan(D, W, dtype, dev, varlen=cu is not None)
    ws = CausalConv1dNondetWorkspace.for_plan(plan, dev, max_tokens=B * T, max_seqs=N)

    def make_inputs(seed):
        return (randn((B, T, D), dtype, dev, seed=10 * seed + 1),
                randn((D, W), dtype, dev, seed=10 * seed + 2, scale=W ** -0.5),
                randn((D,), dtype, dev, seed=10 * seed + 3),
                randn((N, D, W - 1), dtype, dev, seed=10 * seed + 4),
                randn((B, T, D), dtype, dev, seed=10 * seed + 5),
                randn((N, D, W - 1), dtype, dev, seed=10 * seed + 6))

    def step(x, w, b, h0, dy, dht):
        x, w, b, h0 = (t.detach().requires_grad_() for t in (x, w, b, h0))
        y, ht = causal_conv1d_nondet(x, w, b, activation="silu", cu_seqlens=cu,
                                     initial_state=h0, output_final_state=True, plan=plan,
                                     workspace=ws)
        grads = torch.autograd.grad((y, ht), (x, w, b, h0), (dy, dht))
        return (y.detach(), ht.detach(), *grads)

    return make_inputs, step, ("y", "final_state", "dx", "dweight", "dbias", "dh0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("B,T,D,W,dtype,lens", [
    (2, 100, 64, 4, torch.bfloat16, None),
    (1, 0, 48, 3, torch.float32, (1, 70, 0, 65, 9)),
])
def test_graph_replay_matches_eager(B, T, D, W, dtype, lens):
    make_inputs, step, names = case(torch.device("cuda"), B, T, D, W, dtype, lens)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    D, W, lens = 16, 3, (1, 20, 0, 9)
    make_inputs, step, names = case(torch.device("cpu"), 1, 0, D, W, torch.float32, lens)
    outs = step(*make_inputs(1))
    T, N = sum(lens), len(lens)
    want = [(1, T, D), (N, D, W - 1), (1, T, D), (D, W), (D,), (N, D, W - 1)]
    assert [tuple(o.shape) for o in outs] == want
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
