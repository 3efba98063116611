"""One forward and backward of lm_head_loss_nondet captured in a CUDA graph (static inputs,
a static workspace) and replayed bitwise equal to eager on two sets of fresh values, labels
included (:func:`cake_core.testing.graph_replay_matches_eager`). The rule's CUDA plan reads no
label values on the host (``check_labels = 0``), so it captures as it is; a plan that checks
them (``check_labels = 1``) syncs and cannot. Replays equal to eager bitwise: this package's
kernels today have no atomics; revisit if a plan adds them. The graph test needs CUDA; the
same step runs eagerly on the CPU under Triton's interpreter."""

import dataclasses

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_lm_head_loss_nondet_train import (
    LMHeadLossNondetWorkspace,
    lm_head_loss_nondet,
    make_nondet_plan,
)


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, T, H, V, dtype, reduction, **plan_fields):
    """``(make_inputs, step, names)`` on ``dev``; ``plan_fields`` replace the rule's."""
    plan = dataclasses.replace(make_nondet_plan(H, V, dtype, dev, reduction=reduction),
                               **plan_fields)
    ws = LMHeadLossNondetWorkspace.for_plan(plan, dev, dtype)

    def make_inputs(seed):
        g = torch.Generator().manual_seed(10 * seed)
        labels = torch.randint(0, V, (T,), generator=g)
        labels[torch.randperm(T, generator=g)[: T // 8]] = -100  # some ignored tokens
        return (randn((T, H), dtype, dev, seed=10 * seed + 1),
                randn((V, H), dtype, dev, seed=10 * seed + 2, scale=H ** -0.5),
                labels.to(dev),
                randn((T,) if reduction == "none" else (), torch.float32, dev,
                      seed=10 * seed + 3))

    def step(h, w, labels, dloss):
        h, w = (t.detach().requires_grad_() for t in (h, w))
        loss = lm_head_loss_nondet(h, w, labels, reduction=reduction, plan=plan,
                                   workspace=ws)
        dh, dw = torch.autograd.grad(loss, (h, w), dloss)
        return loss.detach(), dh, dw

    return make_inputs, step, ("loss", "dhidden", "dweight")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("T,H,V,dtype,reduction,fields", [
    (200, 64, 500, torch.bfloat16, "mean", {}),
    (130, 48, 300, torch.float32, "none", {"chunk_tokens": 64}),
])
def test_graph_replay_matches_eager(T, H, V, dtype, reduction, fields):
    make_inputs, step, names = case(torch.device("cuda"), T, H, V, dtype, reduction, **fields)
    assert make_nondet_plan(H, V, dtype, "cuda", reduction=reduction).check_labels == 0
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    T, H, V = 40, 48, 100
    make_inputs, step, names = case(torch.device("cpu"), T, H, V, torch.float32, "none",
                                    chunk_tokens=32)
    outs = step(*make_inputs(1))
    assert [tuple(o.shape) for o in outs] == [(T,), (T, H), (V, H)]
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
