"""A sample of the det package's refusals (the same checks run here): ValueErrors naming
the argument, before any allocation or launch, the caller's tensors unchanged."""

import cake_kda_det_train.api as det_api
import pytest
import torch
from _kda_nd_cases import DEV, cu_of, make
from cake_core.testing import assert_raises_unmodified, no_kernel_launches
from cake_kda_nondet_train import chunk_kda_nondet, chunk_kda_nondet_bwd, chunk_kda_nondet_fwd

_LAUNCHES = ("_launch_fwd", "_launch_bwd", "_l2norm", "_beta_fwd", "_beta_bwd",
             "kda_chunk_fwd", "kda_chunk_bwd")


def _base():
    q, k, v, g, beta, *_ = make(1, 10, 2, 4, 16, 16, seed=1, h0=False)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


CASES = {
    "q 3-D": (lambda a: {**a, "q": a["q"][0]}, r"q: expected 4-D tensor"),
    "q float64": (lambda a: {**a, "q": a["q"].double()}, "q: expected dtype"),
    "HV not a multiple of H": (lambda a: {**a, "v": a["v"][:, :, :3], "g": a["g"][:, :, :3],
                                          "beta": a["beta"][:, :, :3]}, "multiple"),
    "cu_seqlens decreasing": (lambda a: {**a, "cu_seqlens": torch.tensor(
        [0, 6, 4, 10], dtype=torch.int32, device=DEV)}, "cu_seqlens"),
    "scale <= 0": (lambda a: {**a, "scale": -1.0}, "scale"),
    "gate without A_log": (lambda a: {**a, "use_gate_in_kernel": True}, "A_log: required"),
    "safe_gate without lower_bound": (lambda a: {**a, "use_gate_in_kernel": True,
                                                 "A_log": torch.zeros(4, device=DEV),
                                                 "safe_gate": True}, "lower_bound"),
    "initial_state of another N": (lambda a: {**a, "cu_seqlens": cu_of([4, 6]),
                                              "initial_state": torch.zeros(3, 4, 16, 16)},
                                   "initial_state"),
}


@pytest.mark.parametrize("entry", [chunk_kda_nondet, chunk_kda_nondet_fwd],
                         ids=["autograd", "fwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, entry):
    change, match = CASES[case]
    with no_kernel_launches(det_api, *_LAUNCHES):
        assert_raises_unmodified(entry, change(_base()), match)


def test_fla_keyword_refusals():
    a = _base()
    with pytest.raises(TypeError, match="chunk_kda_nondet.*unknown_kw"):
        chunk_kda_nondet(**a, unknown_kw=1)
    with no_kernel_launches(det_api, *_LAUNCHES):
        with pytest.raises(ValueError, match="chunk_size"):
            chunk_kda_nondet(**a, chunk_size=32)


def test_bad_backward_inputs_before_launch():
    a = _base()
    _, _, saved = chunk_kda_nondet_fwd(**a, output_final_state=True)
    do = torch.ones_like(a["v"])
    with no_kernel_launches(det_api, *_LAUNCHES):
        assert_raises_unmodified(chunk_kda_nondet_bwd,
                                 {"do": do[:, :5], "dht": None, "saved": saved}, "do")
        assert_raises_unmodified(chunk_kda_nondet_bwd,
                                 {"do": do, "dht": torch.zeros(1, 4, 16, 8), "saved": saved},
                                 "dht")
        assert_raises_unmodified(chunk_kda_nondet_bwd,
                                 {"do": do, "dht": None, "saved": {"q": a["q"]}}, "saved: got")
