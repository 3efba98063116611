"""One forward and backward of gqa captured in a CUDA graph (static inputs, a static
workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`): a batch with a sliding window, and
packed ragged documents (one empty, one of length 1) whose ``cu_seqlens`` stays one
unchanged tensor (its values are read on the host once, before the capture). Replays equal
to eager bitwise: this package's kernels today have no atomics on CUDA (the rule's
``bwd_atomic = 0``: cake-gqa-det-train's dK / dV kernel); revisit if a plan adds them. The
graph test needs CUDA; the same step runs eagerly on the CPU under Triton's interpreter
(whose plan takes the atomic dK / dV kernel)."""

import pytest
import torch
from cake_core.testing import deterministic_algorithms, graph_replay_matches_eager, randn
from cake_core.triton_utils import is_interpreting
from cake_gqa_train import GQAWorkspace, gqa, make_plan


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off():
    """The nondet backward raises under ``torch.use_deterministic_algorithms(True)``."""
    with deterministic_algorithms(False):
        yield


def case(dev, Hq, Hkv, D, dtype, *, B=None, S=None, lens=None, window=(-1, -1)):
    """``(make_inputs, step, names)`` on ``dev``: ``[B, S, H, D]`` or (``lens``) packed."""
    cu = None
    if lens is not None:
        T = sum(lens)
        qs, ks = (T, Hq, D), (T, Hkv, D)
        cu = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(dev, torch.int32)
    else:
        T = B * S
        qs, ks = (B, S, Hq, D), (B, S, Hkv, D)
    plan = make_plan(D, dtype, dev)
    ws = GQAWorkspace.for_plan(plan, dev, Hq, T, Hkv, T)

    def make_inputs(seed):
        return tuple(randn(s, dtype, dev, seed=10 * seed + i)
                     for i, s in enumerate((qs, ks, ks, qs)))

    def step(q, k, v, do):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = gqa(q, k, v, cu, window_size=window, return_lse=True, plan=plan,
                       workspace=ws)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        return out.detach(), lse.detach(), dq, dk, dv

    return make_inputs, step, ("out", "lse", "dq", "dk", "dv")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("Hq,Hkv,D,dtype,kw", [
    (4, 2, 64, torch.bfloat16, {"B": 2, "S": 100, "window": (31, 0)}),
    (4, 1, 128, torch.float32, {"lens": (1, 70, 0, 65, 9)}),
])
def test_graph_replay_matches_eager(Hq, Hkv, D, dtype, kw):
    assert make_plan(D, dtype, "cuda").bwd_atomic == 0  # the bitwise check assumes it
    make_inputs, step, names = case(torch.device("cuda"), Hq, Hkv, D, dtype, **kw)
    graph_replay_matches_eager(make_inputs, step, names=names)


@pytest.mark.skipif(not is_interpreting(), reason="Triton compiles for CUDA in this process")
def test_step_runs_eagerly_on_the_cpu():
    Hq, Hkv, D, lens = 4, 2, 64, (1, 20, 0, 9)
    make_inputs, step, names = case(torch.device("cpu"), Hq, Hkv, D, torch.float32,
                                    lens=lens)
    outs = step(*make_inputs(1))
    T = sum(lens)
    want = [(T, Hq, D), (Hq, T), (T, Hq, D), (T, Hkv, D), (T, Hkv, D)]
    assert [tuple(o.shape) for o in outs] == want
    for name, o in zip(names, outs, strict=True):
        assert torch.isfinite(o).all(), name
