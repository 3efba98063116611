"""One forward and backward of gqa_det captured in a CUDA graph (static inputs, a static
workspace) and replayed bitwise equal to eager on two sets of fresh values
(:func:`cake_core.testing.graph_replay_matches_eager`): a batch with a sliding window, and
packed ragged documents (one empty, one of length 1) whose ``cu_seqlens`` stays one
unchanged tensor (its values are read on the host once, before the capture). CUDA only:
skipped elsewhere."""

import pytest
import torch
from cake_core.testing import graph_replay_matches_eager, randn
from cake_gqa_det_train import GQADetWorkspace, gqa_det, make_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device")


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
    ws = GQADetWorkspace.for_plan(plan, dev, Hq, T)

    def make_inputs(seed):
        return tuple(randn(s, dtype, dev, seed=10 * seed + i)
                     for i, s in enumerate((qs, ks, ks, qs)))

    def step(q, k, v, do):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = gqa_det(q, k, v, cu, window_size=window, return_lse=True, plan=plan,
                           workspace=ws)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        return out.detach(), lse.detach(), dq, dk, dv

    return make_inputs, step, ("out", "lse", "dq", "dk", "dv")


@pytest.mark.parametrize("Hq,Hkv,D,dtype,kw", [
    (4, 2, 64, torch.bfloat16, {"B": 2, "S": 100, "window": (31, 0)}),
    (4, 1, 128, torch.float32, {"lens": (1, 70, 0, 65, 9)}),
])
def test_graph_replay_matches_eager(Hq, Hkv, D, dtype, kw):
    make_inputs, step, names = case(torch.device("cuda"), Hq, Hkv, D, dtype, **kw)
    graph_replay_matches_eager(make_inputs, step, names=names)
