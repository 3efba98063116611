"""Bad inputs raise ValueError before any launch, as in cake-gdn-det-train, and leave the
caller's tensors as they were (a representative subset of the det package's table)."""

import cake_gdn_det_train.api as det_api
import pytest
import torch
from _gdn_nd_cases import DEV
from cake_core.testing import args_with, assert_raises_unmodified, randn
from cake_gdn_nondet_train import (
    GDNNondetWorkspace,
    chunk_gated_delta_rule_nondet,
    chunk_gdn_nondet_bwd,
    chunk_gdn_nondet_fwd,
    make_nondet_plan,
)


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    for name in ("_launch_fwd", "_launch_bwd", "_l2norm"):
        monkeypatch.setattr(det_api, name, boom)


def _base(B=1, T=10, H=2, HV=4, K=16, V=16, dtype=torch.float32):
    return {
        "q": randn((B, T, H, K), dtype, DEV, seed=1),
        "k": randn((B, T, H, K), dtype, DEV, seed=2),
        "v": randn((B, T, HV, V), dtype, DEV, seed=3),
        "g": -randn((B, T, HV), torch.float32, DEV, seed=4).abs(),
        "beta": randn((B, T, HV), torch.float32, DEV, seed=5).sigmoid(),
    }


def _with(**changes):
    return args_with(_base, **changes)


def _cu(*vals):
    return lambda a: torch.tensor(vals, dtype=torch.int32, device=DEV)


def _ws(K=16, V=16, HV=4, T=10):
    return lambda a: GDNNondetWorkspace.for_plan(make_nondet_plan(K, V, torch.float32, DEV),
                                                 DEV, num_v_heads=HV, max_tokens=T)


CASES = {
    "q 3-D": (_with(q=lambda a: a["q"][0]), "q: expected 4-D tensor"),
    "q float64": (_with(q=lambda a: a["q"].double()), "q: expected dtype"),
    "K too large": (_with(base={"K": 300}), "head dim K"),
    "HV not multiple of H": (_with(base={"HV": 3}), "multiple of the q/k heads"),
    "g shape": (_with(g=lambda a: a["g"][..., :2]), r"g: expected shape \[1, 10, 4\]"),
    "scale negative": (_with(scale=lambda a: -1.0), "scale"),
    "flag not bool": (_with(output_final_state=lambda a: "yes"), "output_final_state"),
    "cu_seqlens decreasing": (_with(cu_seqlens=_cu(0, 6, 4, 10)), "non-decreasing"),
    "cu_seqlens short of T": (_with(cu_seqlens=_cu(0, 4, 9)), "must end at the token count"),
    "initial_state wrong N": (
        _with(cu_seqlens=_cu(0, 4, 10),
              initial_state=lambda a: torch.zeros(1, 4, 16, 16, device=DEV)),
        r"initial_state: expected shape \[2, 4, 16, 16\]"),
    "plan for other K": (_with(plan=lambda a: make_nondet_plan(32, 16, torch.float32, DEV)),
                         "plan: made for K=32"),
    "workspace too small": (_with(workspace=_ws(T=9)), "workspace: holds 9 tokens"),
    "workspace other HV": (_with(workspace=_ws(HV=2)), "workspace: buffer 'w' must be"),
    "A_log missing": (_with(use_gate_in_kernel=lambda a: True), "A_log: required"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    make, msg = CASES[case]
    assert_raises_unmodified(chunk_gdn_nondet_fwd, make(), msg)


@pytest.mark.parametrize("case", ["q float64", "plan for other K", "cu_seqlens decreasing"])
def test_autograd_entry_refuses_as_well(case, no_launch):
    make, msg = CASES[case]
    args = {n: a for n, a in make().items() if n != "workspace"}
    assert_raises_unmodified(chunk_gated_delta_rule_nondet, args, msg)


@pytest.mark.parametrize("fla_kw, msg", [
    (dict(chunk_size=32), "chunk_size=32 is not supported"),
    (dict(cp_context=object()), "kcp"),
    (dict(cu_seqlens=True), "10th positional argument is cu_seqlens"),
], ids=["chunk_size", "cp_context", "cu_seqlens-bool"])
def test_fla_keyword_refusals(fla_kw, msg, no_launch):
    assert_raises_unmodified(chunk_gated_delta_rule_nondet, {**_base(), **fla_kw}, msg)


def test_unknown_keyword_names_the_nondet_entry():
    with pytest.raises(TypeError, match=r"chunk_gated_delta_rule_nondet\(\) got an unexpected"):
        chunk_gated_delta_rule_nondet(**_base(), deterministic=True)


@pytest.fixture(scope="module")
def saved():
    return chunk_gdn_nondet_fwd(**_base())[2]


def test_backward_bad_upstream_gradients(saved, no_launch):
    for do, dht, msg in ((torch.zeros(1, 9, 4, 16, device=DEV), None, "do: expected shape"),
                         (torch.zeros(1, 10, 4, 16, device=DEV, dtype=torch.float64), None,
                          "do: expected dtype"),
                         (torch.zeros(1, 10, 4, 16, device=DEV),
                          torch.zeros(1, 4, 16, 8, device=DEV), "dht: expected shape")):
        with pytest.raises(ValueError, match=msg):
            chunk_gdn_nondet_bwd(do, dht, saved)
