"""Float64 parity (the det package's reference) on a few of the det package's cases:
ignored rows, a vocabulary off the block size over several chunks, each reduction, the
options; the low-level forward / backward, a workspace and main_grad; torch.compile through
this package's ops."""

import pytest
import torch
from _lmhead_nd_cases import DEV, make
from cake_core.testing import TOLERANCES, assert_close_to_reference, randn
from cake_lm_head_loss_det_train import lm_head_loss_reference
from cake_lm_head_loss_nondet_train import (
    LMHeadLossNondetGrads,
    LMHeadLossNondetSavedSet,
    LMHeadLossNondetWorkspace,
    lm_head_loss_nondet,
    lm_head_loss_nondet_bwd,
    lm_head_loss_nondet_fwd,
    make_nondet_plan,
)


def _reference(hidden, weight, b, labels, up, **opts):
    h64, w64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    b64 = b.detach().double().requires_grad_() if b is not None else None
    ref, lse = lm_head_loss_reference(h64, w64, labels, b64, return_lse=True,
                                      dtype=torch.float64, **opts)
    ref.backward(up.double())
    return ref, lse, h64.grad, w64.grad, b64.grad if b is not None else None


# V = 3000: the CPU rule's 2048-column vocabulary blocks do not divide it, and its 16-token
# chunks cut the 37 tokens into three (the last one partial)
@pytest.mark.parametrize("reduction,V,opts", [
    ("mean", 3000, {}),
    ("sum", 7, {"label_smoothing": 0.2, "z_loss": 1e-3, "logit_softcap": 3.0}),
    ("none", 1000, {"z_loss": 1e-2}),
], ids=str)
def test_parity_fp32(reduction, V, opts):
    hidden, weight, b, labels = make((37,), 24, V, bias=V == 7, seed=V)
    loss, lse = lm_head_loss_nondet(hidden, weight, labels, bias=b, reduction=reduction,
                                    return_lse=True, **opts)
    up = randn(loss.shape, torch.float32, DEV, seed=77) if reduction == "none" else \
        torch.tensor(0.7, device=DEV)
    loss.backward(up)
    ref, lse64, dh, dw, db = _reference(hidden, weight, b, labels, up, reduction=reduction,
                                        **opts)
    tol = TOLERANCES[torch.float32]
    for name, a, r in (("loss", loss, ref), ("lse", lse, lse64), ("dhidden", hidden.grad, dh),
                       ("dweight", weight.grad, dw)):
        assert_close_to_reference(a, r, torch.float32, name, tol)
    if b is not None:
        assert_close_to_reference(b.grad, db, torch.float32, "dbias", tol)


def test_parity_bf16_batched_with_ignored_rows():
    hidden, weight, _, labels = make((2, 9), 16, 300, torch.bfloat16, ignore_every=3, seed=4)
    loss = lm_head_loss_nondet(hidden, weight, labels)
    assert type(loss.grad_fn).__name__ == "_LMHeadLossNondetFunctionBackward"
    loss.backward()
    ref, _, dh, dw, _ = _reference(hidden, weight, None, labels, torch.tensor(1.0))
    for name, a, r in (("loss", loss, ref), ("dhidden", hidden.grad, dh),
                       ("dweight", weight.grad, dw)):
        assert_close_to_reference(a, r, torch.bfloat16, name)


def test_every_token_ignored_gives_zeros():
    hidden, weight, _, labels = make((5,), 8, 20, seed=2)
    labels[:] = -100
    loss = lm_head_loss_nondet(hidden, weight, labels)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert not hidden.grad.any() and not weight.grad.any()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_low_level_workspace_and_main_grad(reduction):
    hidden, weight, b, labels = make((20,), 16, 90, bias=True, seed=6)
    loss = lm_head_loss_nondet(hidden, weight, labels, bias=b, reduction=reduction)
    up = torch.ones_like(loss) * 0.5
    loss.backward(up)
    plan = make_nondet_plan(16, 90, torch.float32, DEV, reduction=reduction)
    ws = LMHeadLossNondetWorkspace.for_plan(plan, DEV, torch.float32)
    (l2, _), saved = lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels,
                                              bias=b.detach(), reduction=reduction,
                                              workspace=ws)
    assert isinstance(saved, LMHeadLossNondetSavedSet) and saved.plan == plan
    mg = torch.zeros(90, 16, device=DEV)
    g = lm_head_loss_nondet_bwd(up, saved, workspace=ws, main_grad=mg)
    assert isinstance(g, LMHeadLossNondetGrads) and g.dweight is None
    torch.testing.assert_close(l2, loss.detach())
    torch.testing.assert_close(g.dhidden, hidden.grad)
    torch.testing.assert_close(g.dbias, b.grad)
    torch.testing.assert_close(mg, weight.grad)


def test_compile_fullgraph_runs_this_packages_ops():
    from torch._dynamo.testing import CompileCounterWithBackend

    def step(h, w, y):
        return lm_head_loss_nondet(h, w, y, z_loss=1e-3)

    hidden, weight, _, labels = make((12,), 16, 40, seed=8)
    want = step(hidden, weight, labels)
    want.backward()
    grads = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager" if DEV.type == "cpu" else "inductor")
    got = torch.compile(step, fullgraph=True, backend=cnt)(hidden, weight, labels)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close((hidden.grad, weight.grad), grads)
    assert cnt.frame_count == 1
    code = cnt.graphs[0].code
    assert "cake_lm_head_loss_nondet_train.fwd" in code
    assert "cake_lm_head_loss_det_train" not in code
