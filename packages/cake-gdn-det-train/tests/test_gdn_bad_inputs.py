"""Bad inputs raise ValueError before any launch and leave the caller's tensors as they were."""

import cake_gdn_det_train.api as api
import pytest
import torch
from cake_core.testing import args_with, assert_raises_unmodified, randn
from cake_core.triton_utils import default_device
from cake_gdn_det_train import GDNDetWorkspace, chunk_gdn_det_fwd, make_plan

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched for bad input")

    monkeypatch.setattr(api, "_launch_fwd", boom)
    monkeypatch.setattr(api, "_l2norm", boom)


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


def _head_first(name):
    """The base's ``name`` as a head-first ([B, H, T, ...]) view."""
    return lambda a: a[name].transpose(1, 2)


def _cu(*vals, dtype=torch.int32):
    return lambda a: torch.tensor(vals, dtype=dtype, device=DEV)


CASES = {
    "q 3-D": (_with(q=lambda a: a["q"][0]),
              r"q: expected 4-D tensor \(\[B, T, H, K\], FLA's layout; head-first "
              r"\[B, H, T, K\] is not served\), got 3-D \(10, 2, 16\)"),
    # every input head-first ([B, H, T, K]): q and k read as T = 2, H = 10; v says why
    "head-first inputs": (
        _with(**{n: _head_first(n) for n in ("q", "k", "v", "g", "beta")}),
        r"v: expected shape \[1, 2, \*, \*\] \(\[B, T, HV, V\], FLA's layout; head-first "
        r"\[B, HV, T, V\] is not served\), got \[1, 4, 10, 16\]"),
    "q int": (_with(q=lambda a: a["q"].to(torch.int32)), "q: expected dtype"),
    "q float64": (_with(q=lambda a: a["q"].double()), "q: expected dtype"),
    "K too large": (_with(base={"K": 300}), "head dim K"),
    "k shape": (_with(k=lambda a: a["k"][:, :9]), r"k: expected shape \[1, 10, 2, 16\]"),
    "k dtype": (_with(k=lambda a: a["k"].half()), "k: expected dtype"),
    "v T differs": (_with(v=lambda a: a["v"][:, :9]), "v: expected shape"),
    "v 3-D": (_with(v=lambda a: a["v"][0]), "v: expected 4-D"),
    "HV not multiple of H": (_with(base={"HV": 3}), "multiple of the q/k heads"),
    "v dtype": (_with(v=lambda a: a["v"].bfloat16()), "v: expected dtype"),
    "V too large": (_with(base={"V": 257}), "head dim V"),
    "g shape": (_with(g=lambda a: a["g"][..., :2]), r"g: expected shape \[1, 10, 4\]"),
    "g float64": (_with(g=lambda a: a["g"].double()), "g: expected dtype"),
    "beta shape": (_with(beta=lambda a: a["beta"][:, :, :, None]), "beta: expected shape"),
    "beta fp16 with fp32 q": (_with(beta=lambda a: a["beta"].half()), "beta: expected dtype"),
    "scale zero": (_with(scale=lambda a: 0.0), "scale"),
    "scale nan": (_with(scale=lambda a: float("nan")), "scale"),
    "scale negative": (_with(scale=lambda a: -1.0), "scale"),
    "flag not bool": (_with(output_final_state=lambda a: "yes"), "output_final_state"),
    "l2 flag not bool": (_with(use_qk_l2norm_in_kernel=lambda a: 1), "use_qk_l2norm"),
    "devices differ": (_with(g=lambda a: torch.zeros(1, 10, 4, device="meta")), "g: on meta"),
    "cu_seqlens with B > 1": (_with(base={"B": 2, "T": 5}, cu_seqlens=_cu(0, 5)),
                              "cu_seqlens: packed sequences need B == 1"),
    "cu_seqlens float": (_with(cu_seqlens=lambda a: torch.tensor([0.0, 10.0])),
                         "cu_seqlens: expected dtype"),
    "cu_seqlens 2-D": (_with(cu_seqlens=lambda a: torch.tensor([[0, 10]], dtype=torch.int32)),
                       "cu_seqlens: expected 1-D"),
    "cu_seqlens one entry": (_with(cu_seqlens=_cu(0)), "at least 2 entries"),
    "cu_seqlens not from 0": (_with(cu_seqlens=_cu(1, 10)), "must start at 0"),
    "cu_seqlens decreasing": (_with(cu_seqlens=_cu(0, 6, 4, 10, dtype=torch.int64)),
                              "non-decreasing"),
    "cu_seqlens short of T": (_with(cu_seqlens=_cu(0, 4, 9)), "must end at the token count"),
    "initial_state wrong N (packed)": (
        _with(cu_seqlens=_cu(0, 4, 10),
              initial_state=lambda a: torch.zeros(1, 4, 16, 16, device=DEV)),
        r"initial_state: expected shape \[2, 4, 16, 16\]"),
    "initial_state wrong N (fixed)": (
        _with(initial_state=lambda a: torch.zeros(2, 4, 16, 16, device=DEV)),
        r"initial_state: expected shape \[1, 4, 16, 16\]"),
    "initial_state bf16": (
        _with(initial_state=lambda a: torch.zeros(1, 4, 16, 16, device=DEV,
                                                  dtype=torch.bfloat16)),
        "initial_state: expected dtype"),
    "initial_state wrong HV": (
        _with(initial_state=lambda a: torch.zeros(1, 2, 16, 16, device=DEV)), "initial_state"),
    "plan for other K": (_with(plan=lambda a: make_plan(32, 16, torch.float32, DEV)),
                         "plan: made for K=32"),
    "plan a dict": (_with(plan=lambda a: make_plan(16, 16, torch.float32, DEV).to_dict()),
                    "plan: got dict"),
    "workspace too small": (
        _with(workspace=lambda a: GDNDetWorkspace.for_plan(
            make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=4, max_tokens=9)),
        "workspace: holds 9 tokens"),
    "workspace other HV": (
        _with(workspace=lambda a: GDNDetWorkspace.for_plan(
            make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=2, max_tokens=10)),
        "workspace: buffer 'w' must be"),
    "workspace other plan": (
        _with(workspace=lambda a: GDNDetWorkspace.for_plan(
            make_plan(16, 32, torch.float32, DEV), DEV, num_v_heads=4, max_tokens=10)),
        "was made for plan"),
    "workspace a tensor": (_with(workspace=lambda a: torch.zeros(3)), "workspace: got Tensor"),
    "gate flag not bool": (_with(use_gate_in_kernel=lambda a: 1), "use_gate_in_kernel"),
    "beta sigmoid flag not bool": (_with(use_beta_sigmoid_in_kernel=lambda a: "no"),
                                   "use_beta_sigmoid_in_kernel"),
    "A_log missing": (_with(use_gate_in_kernel=lambda a: True,
                            dt_bias=lambda a: torch.zeros(4, device=DEV)),
                      "A_log: required with use_gate_in_kernel"),
    "A_log wrong shape": (_with(use_gate_in_kernel=lambda a: True,
                                A_log=lambda a: torch.zeros(2, device=DEV)),
                          r"A_log: expected shape \[4\]"),
    "A_log 2-D": (_with(use_gate_in_kernel=lambda a: True,
                        A_log=lambda a: torch.zeros(1, 4, device=DEV)), "A_log: expected"),
    "A_log float64": (_with(use_gate_in_kernel=lambda a: True,
                            A_log=lambda a: torch.zeros(4, device=DEV, dtype=torch.float64)),
                      "A_log: expected dtype"),
    "A_log not a tensor": (_with(use_gate_in_kernel=lambda a: True, A_log=lambda a: [0.0] * 4),
                           "A_log"),
    "A_log on meta": (_with(use_gate_in_kernel=lambda a: True,
                            A_log=lambda a: torch.zeros(4, device="meta")), "A_log: on meta"),
    "dt_bias wrong shape": (_with(use_gate_in_kernel=lambda a: True,
                                  A_log=lambda a: torch.zeros(4, device=DEV),
                                  dt_bias=lambda a: torch.zeros(5, device=DEV)),
                            r"dt_bias: expected shape \[4\]"),
    "dt_bias fp16 with fp32 q": (_with(use_gate_in_kernel=lambda a: True,
                                       A_log=lambda a: torch.zeros(4, device=DEV),
                                       dt_bias=lambda a: torch.zeros(4, device=DEV,
                                                                     dtype=torch.float16)),
                                 "dt_bias: expected dtype"),
    "dt_bias on meta": (_with(use_gate_in_kernel=lambda a: True,
                              A_log=lambda a: torch.zeros(4, device=DEV),
                              dt_bias=lambda a: torch.zeros(4, device="meta")),
                        "dt_bias: on meta"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_before_launch(case, no_launch):
    make, msg = CASES[case]
    assert_raises_unmodified(chunk_gdn_det_fwd, make(), msg)


def test_make_plan_and_plan_fields_refused():
    with pytest.raises(ValueError, match="head_k_dim"):
        make_plan(0, 16, torch.float32, DEV)
    with pytest.raises(ValueError, match="head_v_dim"):
        make_plan(16, 512, torch.float32, DEV)
    with pytest.raises(ValueError, match="dtype"):
        make_plan(16, 16, torch.float64, DEV)
    d = make_plan(16, 16, torch.float32, DEV).to_dict()
    for field, value, msg in (("block_k", 8, "block_k must be a power of two >= 16"),
                              ("block_v", 24, "block_v must be a power of two"),
                              ("fp32_dots", 3, "fp32_dots"),
                              ("store_16bit", 2, "store_16bit must be 0 or 1"),
                              ("gate_block_t", 24, "gate_block_t must be a power of two"),
                              ("num_warps_h", 3, "num_warps_h"),
                              ("num_warps_local", 3, "num_warps_local"),
                              ("local_form", 1, "local_form must be 0 or 2"),
                              ("rec_form", 2, "rec_form")):
        with pytest.raises(ValueError, match=msg):
            type(make_plan(16, 16, torch.float32, DEV)).from_dict({**d, field: value})
    for gone in ("chunk_size", "keep_a", "num_warps_o", "prep_block", "inv_kernel"):
        with pytest.raises(ValueError, match=f"unknown GDNDetPlan fields .*{gone}"):
            type(make_plan(16, 16, torch.float32, DEV)).from_dict({**d, gone: 0})


@pytest.mark.parametrize("fla_kw, msg", [
    (dict(chunk_size=32), "chunk_size=32 is not supported"),
    (dict(state_v_first=True), "state_v_first=True is not supported"),
    (dict(cp_context=object()), "kcp"),
    (dict(cu_seqlens=True), "10th positional argument is cu_seqlens"),
], ids=["chunk_size", "state_v_first", "cp_context", "cu_seqlens-bool"])
def test_fla_keyword_refusals_before_launch(fla_kw, msg, no_launch):
    """FLA's keywords at values cake does not implement: ValueError from the autograd entry
    before any launch, the caller's tensors unchanged."""
    from cake_gdn_det_train import chunk_gated_delta_rule_det

    assert_raises_unmodified(chunk_gated_delta_rule_det, {**_base(), **fla_kw}, msg)
