"""A few of the det package's bad inputs: the same ValueError, before any launch."""

import cake_lm_head_loss_det_train.api as det_api
import pytest
import torch
from _lmhead_nd_cases import DEV, make
from cake_core.testing import no_kernel_launches
from cake_lm_head_loss_nondet_train import (
    lm_head_loss_nondet,
    lm_head_loss_nondet_bwd,
    lm_head_loss_nondet_fwd,
)

H, V = 8, 20


@pytest.fixture
def data():
    return make((6,), H, V, seed=3)


@pytest.mark.parametrize("kw,match", [
    (dict(hidden=torch.ones(H)), "hidden: expected a 2-D"),
    (dict(weight=torch.ones(H, V)), r"weight: expected shape \[V, 8\]"),
    (dict(labels=torch.zeros(6, dtype=torch.int32)), "labels: expected dtype"),
    (dict(labels=torch.full((6,), V)), r"labels: values must be in \[0, 20\)"),
    (dict(bias=torch.ones(V + 1)), "bias: expected shape"),
    (dict(reduction="avg"), "reduction"),
    (dict(label_smoothing=1.5), "label_smoothing"),
    (dict(logit_softcap=0.0), "logit_softcap"),
])
def test_bad_forward_inputs(data, kw, match):
    if match.startswith("labels: values") and DEV.type != "cpu":
        pytest.skip("label values on a GPU are not read by the rule's plan (no host sync)")
    hidden, weight, _, labels = data
    kw = {k: v.to(DEV) if torch.is_tensor(v) else v for k, v in kw.items()}
    args = dict(hidden=hidden, weight=weight, labels=labels) | kw
    h, w, y = args.pop("hidden"), args.pop("weight"), args.pop("labels")
    with no_kernel_launches(det_api, "ce_chunk_kernel", "matmul"):
        for fn in (lm_head_loss_nondet, lm_head_loss_nondet_fwd):
            with pytest.raises(ValueError, match=match):
                fn(h, w, y, **args)


def test_bad_backward_inputs(data):
    hidden, weight, _, labels = data
    (loss, _), saved = lm_head_loss_nondet_fwd(hidden.detach(), weight.detach(), labels)
    with no_kernel_launches(det_api, "ce_chunk_kernel", "matmul"):
        with pytest.raises(ValueError, match="dloss: expected dtype"):
            lm_head_loss_nondet_bwd(torch.tensor(1.0, dtype=torch.float64, device=DEV), saved)
        with pytest.raises(ValueError, match="dloss: expected shape"):
            lm_head_loss_nondet_bwd(torch.ones(6, device=DEV), saved)
        with pytest.raises(ValueError, match="main_grad"):
            lm_head_loss_nondet_bwd(torch.ones_like(loss), saved,
                                    main_grad=torch.zeros(V, H + 1, device=DEV))
