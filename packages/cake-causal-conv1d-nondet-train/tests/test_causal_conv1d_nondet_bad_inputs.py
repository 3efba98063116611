"""A few of the det package's bad inputs: the same ValueError, before any launch."""

import cake_causal_conv1d_det_train.api as det_api
import pytest
import torch
from _conv_nd_cases import DEV, make_inputs
from cake_causal_conv1d_nondet_train import (
    causal_conv1d_nondet,
    causal_conv1d_nondet_bwd,
    causal_conv1d_nondet_fwd,
)
from cake_core.testing import no_kernel_launches


@pytest.fixture
def inp():
    return make_inputs(2, 10, 8, 4, seed=5)


@pytest.mark.parametrize("kw,match", [
    (dict(x=torch.ones(2, 10)), "x: expected"),
    (dict(weight=torch.ones(8, 9)), "weight: kernel size W"),
    (dict(weight=torch.ones(7, 4)), r"weight: expected shape \[8, W\]"),
    (dict(activation="relu"), "activation"),
    (dict(cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32)), "cu_seqlens: packed"),
    (dict(initial_state=torch.ones(2, 8, 4)), "initial_state: expected shape"),
    (dict(output_final_state=1), "output_final_state"),
])
def test_bad_forward_inputs(inp, kw, match):
    args = dict(x=inp.x, weight=inp.weight, bias=inp.bias) | kw
    x, w, b = args.pop("x"), args.pop("weight"), args.pop("bias")
    with no_kernel_launches(det_api, "_launch_fwd", "_launch_bwd"):
        for fn in (causal_conv1d_nondet, causal_conv1d_nondet_fwd):
            with pytest.raises(ValueError, match=match):
                fn(x.to(DEV), w.to(DEV), b, **args)


def test_bad_packed_offsets_refused():
    inp = make_inputs(1, 10, 8, 4, seed=6)
    bad = torch.tensor([0, 6, 4, 10], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="cu_seqlens"):
        causal_conv1d_nondet(inp.x, inp.weight, cu_seqlens=bad)


def test_bad_backward_inputs(inp):
    y, _, saved = causal_conv1d_nondet_fwd(inp.x, inp.weight, inp.bias,
                                           initial_state=inp.h0, output_final_state=True)
    with no_kernel_launches(det_api, "_launch_bwd"):
        with pytest.raises(ValueError, match=r"dy: expected shape \[2, 10, 8\]"):
            causal_conv1d_nondet_bwd(inp.dy[:, :-1], None, saved)
        with pytest.raises(ValueError, match="dfinal_state: expected shape"):
            causal_conv1d_nondet_bwd(inp.dy, torch.ones(2, 8, 4, device=DEV), saved)
        with pytest.raises(ValueError, match="dy: expected dtype"):
            causal_conv1d_nondet_bwd(inp.dy.to(torch.int32), None, saved)
