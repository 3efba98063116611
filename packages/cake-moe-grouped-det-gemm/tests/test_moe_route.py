"""The router's top-k softmax gate (one kernel each way) against torch's composition:
softmax in fp32, a stable descending sort, the k weights (divided by their sum), and the
gradient of the logits in float64."""

import pytest
import torch
from _moe_cases import DEV
from cake_core.testing import assert_close_to_reference, bitwise_equal, randn
from cake_moe_grouped_det_gemm import moe_route_det


@pytest.mark.parametrize("T,E,k", [(37, 5, 2), (200, 32, 4), (9, 1, 1), (16, 7, 7),
                                   (70, 160, 8), (0, 8, 2)])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gate_matches_torch(T, E, k, normalize, dtype):
    logits = randn((T, E), dtype, DEV, seed=T + E, scale=3.0).requires_grad_()
    r = moe_route_det(logits, k, normalize_topk=normalize)
    ref = logits.detach().double().requires_grad_()
    probs = torch.softmax(ref, -1)
    assert r.probs.dtype == torch.float32 and r.weights.dtype == torch.float32
    assert r.ids.dtype == torch.int64 and r.ids.shape == (T, k) and r.ids.is_contiguous()
    # the fp32 probabilities may order two near-equal experts otherwise than float64 does:
    # the ids must be those of the kernel's own probabilities, sorted stably
    own = torch.sort(r.probs.detach(), dim=1, descending=True, stable=True).indices[:, :k]
    assert torch.equal(r.ids, own)
    if T == 0:
        return
    assert_close_to_reference(r.probs, probs, torch.float32, name="probs")
    pw = probs.gather(1, r.ids)  # float64 probabilities of the kernel's experts
    assert_close_to_reference(r.weights, pw / pw.sum(-1, keepdim=True) if normalize else pw,
                              torch.float32, name="weights")
    dw = randn((T, k), torch.float32, DEV, seed=3)
    dp = randn((T, E), torch.float32, DEV, seed=4)
    ((r.weights * dw).sum() + (r.probs * dp).sum()).backward()
    wr = pw / pw.sum(-1, keepdim=True) if normalize else pw
    ((wr * dw.double()).sum() + (probs * dp.double()).sum()).backward()
    assert logits.grad.dtype == dtype
    assert_close_to_reference(logits.grad, ref.grad, dtype, name="dlogits",
                              tol=None if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's NaN
def test_ties_nan_and_minus_inf_rows():
    """Equal logits go to the lower expert; a NaN logit makes its row's probabilities NaN,
    and a row of -inf logits too (as torch.softmax), whose experts are then taken in index
    order (torch.sort ranks NaN above numbers, stably); -inf entries of a finite row get
    probability 0 and come last."""
    lg = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0],
                       [0.0, 0.0, 0.0, 0.0, 0.0],
                       [0.1, float("nan"), 2.0, 0.3, 0.2],
                       [float("-inf")] * 5,
                       [float("-inf"), 1.0, float("-inf"), 2.0, 0.0]], device=DEV)
    r = moe_route_det(lg, 3, normalize_topk=False)
    assert r.ids.tolist()[:2] == [[1, 2, 4], [0, 1, 2]]
    assert r.ids[2].tolist() == [0, 1, 2] and bool(torch.isnan(r.weights[2]).all())
    assert bool(torch.isnan(r.probs[3]).all()) and r.ids[3].tolist() == [0, 1, 2]
    assert r.ids[4].tolist() == [3, 1, 4] and float(r.probs[4, 0]) == 0.0
    want = torch.softmax(lg[:2], -1)
    assert torch.allclose(r.probs[:2], want, rtol=1e-6, atol=0)


def test_gate_repeats_bitwise_and_strided_logits():
    base = randn((300, 48), torch.float32, DEV, seed=9, scale=2.0)
    a = moe_route_det(base[:, 8:40], 4)
    b = moe_route_det(base[:, 8:40].contiguous(), 4)
    for x, y in zip(a, b, strict=True):
        assert bitwise_equal(x, y)


def test_device_the_backend_cannot_launch_on():
    """A meta (or wrong-device) logits tensor: ValueError naming it, before any launch."""
    with pytest.raises(ValueError, match="logits: on meta"):
        moe_route_det(torch.empty((4, 8), device="meta"), 2)
