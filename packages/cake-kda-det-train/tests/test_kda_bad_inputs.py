"""Bad inputs raise ValueError naming the argument, before any allocation or launch, and
leave the caller's tensors as they were (forward and backward entries)."""

import cake_kda_det_train.api as api
import pytest
import torch
from cake_core.testing import args_with, assert_raises_unmodified, randn
from cake_core.triton_utils import default_device
from cake_kda_det_train import (
    KDADetWorkspace,
    chunk_kda_det,
    chunk_kda_det_bwd,
    chunk_kda_det_fwd,
    make_plan,
)

DEV = default_device()


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was launched (or an output allocated) for bad input")

    for name in ("_launch_fwd", "_launch_bwd", "_l2norm", "_beta_fwd", "_beta_bwd",
                 "kda_chunk_fwd", "kda_chunk_bwd"):
        monkeypatch.setattr(api, name, boom)


def _base(B=1, T=10, H=2, HV=4, K=16, V=16, dtype=torch.float32):
    return {
        "q": randn((B, T, H, K), dtype, DEV, seed=1),
        "k": randn((B, T, H, K), dtype, DEV, seed=2),
        "v": randn((B, T, HV, V), dtype, DEV, seed=3),
        "g": -randn((B, T, HV, K), torch.float32, DEV, seed=4).abs(),
        "beta": randn((B, T, HV), torch.float32, DEV, seed=5).sigmoid(),
    }


def _with(**changes):
    return args_with(_base, **changes)


def _head_first(name):
    """The base's ``name`` as a head-first ([B, H, T, ...]) view."""
    return lambda a: a[name].transpose(1, 2)


def _cu(*vals, dtype=torch.int32):
    return lambda a: torch.tensor(vals, dtype=dtype, device=DEV)


def _t(*shape, dtype=torch.float32, device=None):
    return lambda a: torch.zeros(*shape, dtype=dtype, device=device or DEV)


_GATE = {"use_gate_in_kernel": lambda a: True}
_A = {**_GATE, "A_log": _t(4)}

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
    "q not a tensor": (_with(q=lambda a: a["q"].tolist()), "q: expected a torch.Tensor"),
    "K too large": (_with(base={"K": 300}), "head dim K"),
    "k shape": (_with(k=lambda a: a["k"][:, :9]), r"k: expected shape \[1, 10, 2, 16\]"),
    "k dtype": (_with(k=lambda a: a["k"].half()), "k: expected dtype"),
    "v T differs": (_with(v=lambda a: a["v"][:, :9]), "v: expected shape"),
    "v 3-D": (_with(v=lambda a: a["v"][0]), "v: expected 4-D"),
    "HV not multiple of H": (_with(base={"HV": 3}), "multiple of the q/k heads"),
    "v dtype": (_with(v=lambda a: a["v"].bfloat16()), "v: expected dtype"),
    "V too large": (_with(base={"V": 257}), "head dim V"),
    "g per head (GDN's shape)": (_with(g=lambda a: a["g"][..., 0]),
                                 r"g: expected shape \[1, 10, 4, 16\]"),
    "g wrong K": (_with(g=lambda a: a["g"][..., :8]), r"g: expected shape \[1, 10, 4, 16\]"),
    "g float64": (_with(g=lambda a: a["g"].double()), "g: expected dtype"),
    "beta shape": (_with(beta=lambda a: a["beta"][..., None]), "beta: expected shape"),
    "beta fp16 with fp32 q": (_with(beta=lambda a: a["beta"].half()), "beta: expected dtype"),
    "scale zero": (_with(scale=lambda a: 0.0), "scale"),
    "scale nan": (_with(scale=lambda a: float("nan")), "scale"),
    "scale negative": (_with(scale=lambda a: -1.0), "scale"),
    "flag not bool": (_with(output_final_state=lambda a: "yes"), "output_final_state"),
    "l2 flag not bool": (_with(use_qk_l2norm_in_kernel=lambda a: 1), "use_qk_l2norm"),
    "gate flag not bool": (_with(use_gate_in_kernel=lambda a: 1), "use_gate_in_kernel"),
    "sigmoid flag not bool": (_with(use_beta_sigmoid_in_kernel=lambda a: "no"),
                              "use_beta_sigmoid_in_kernel"),
    "neg eigval flag not bool": (_with(allow_neg_eigval=lambda a: 1), "allow_neg_eigval"),
    "safe_gate not bool": (_with(safe_gate=lambda a: None), "safe_gate"),
    "allow_neg_eigval without sigmoid": (_with(allow_neg_eigval=lambda a: True),
                                         "allow_neg_eigval=True requires"),
    "devices differ": (_with(g=_t(1, 10, 4, 16, device="meta")), "g: on meta"),
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
    "cu_seqlens a bool (FLA's positional order)": (
        _with(cu_seqlens=lambda a: True), "cu_seqlens: got a bool; the 10th positional"),
    "initial_state wrong N (packed)": (
        _with(cu_seqlens=_cu(0, 4, 10), initial_state=_t(1, 4, 16, 16)),
        r"initial_state: expected shape \[2, 4, 16, 16\]"),
    "initial_state wrong N (fixed)": (_with(initial_state=_t(2, 4, 16, 16)),
                                      r"initial_state: expected shape \[1, 4, 16, 16\]"),
    "initial_state bf16": (_with(initial_state=_t(1, 4, 16, 16, dtype=torch.bfloat16)),
                           "initial_state: expected dtype"),
    "initial_state float64": (_with(initial_state=_t(1, 4, 16, 16, dtype=torch.float64)),
                              "initial_state: expected dtype"),
    "initial_state wrong HV": (_with(initial_state=_t(1, 2, 16, 16)), "initial_state"),
    "plan for other K": (_with(plan=lambda a: make_plan(32, 16, torch.float32, DEV)),
                         "plan: made for K=32"),
    "plan a dict": (_with(plan=lambda a: make_plan(16, 16, torch.float32, DEV).to_dict()),
                    "plan: got dict"),
    "workspace too small": (
        _with(workspace=lambda a: KDADetWorkspace.for_plan(
            make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=4, max_tokens=9)),
        "workspace: holds 9 tokens"),
    "workspace too few chunks": (
        _with(cu_seqlens=_cu(0, 4, 10), workspace=lambda a: KDADetWorkspace.for_plan(
            make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=4, max_tokens=10)),
        "workspace: holds 10 tokens and 1 chunks, the call needs 10 and 2"),
    "workspace other HV": (
        _with(workspace=lambda a: KDADetWorkspace.for_plan(
            make_plan(16, 16, torch.float32, DEV), DEV, num_v_heads=2, max_tokens=10)),
        "workspace: buffer 'w' must be"),
    "workspace other plan": (
        _with(workspace=lambda a: KDADetWorkspace.for_plan(
            make_plan(16, 32, torch.float32, DEV), DEV, num_v_heads=4, max_tokens=10)),
        "was made for plan"),
    "workspace a tensor": (_with(workspace=lambda a: torch.zeros(3)), "workspace: got Tensor"),
    "A_log missing": (_with(**_GATE, dt_bias=_t(64)),
                      "A_log: required with use_gate_in_kernel=True unless lower_bound"),
    "A_log wrong shape": (_with(**_GATE, A_log=_t(2)), r"A_log: expected shape \[4\]"),
    "A_log 2-D": (_with(**_GATE, A_log=_t(1, 4)), "A_log: expected"),
    "A_log float64": (_with(**_GATE, A_log=_t(4, dtype=torch.float64)), "A_log: expected dtype"),
    "A_log not a tensor": (_with(**_GATE, A_log=lambda a: [0.0] * 4), "A_log"),
    "A_log on meta": (_with(**_GATE, A_log=_t(4, device="meta")), "A_log: on meta"),
    "dt_bias per head (GDN's shape)": (_with(**_A, dt_bias=_t(4)),
                                       r"dt_bias: expected shape \[64\]"),
    "dt_bias [HV, K]": (_with(**_A, dt_bias=_t(4, 16)), r"dt_bias: expected shape \[64\]"),
    "dt_bias fp16 with fp32 q": (_with(**_A, dt_bias=_t(64, dtype=torch.float16)),
                                 "dt_bias: expected dtype"),
    "dt_bias on meta": (_with(**_A, dt_bias=_t(64, device="meta")), "dt_bias: on meta"),
    "lower_bound zero": (_with(**_GATE, lower_bound=lambda a: 0.0), "lower_bound"),
    "lower_bound positive": (_with(**_A, lower_bound=lambda a: 2.0), "lower_bound"),
    "lower_bound -inf": (_with(**_A, lower_bound=lambda a: float("-inf")), "lower_bound"),
    "lower_bound a bool": (_with(**_A, lower_bound=lambda a: True), "lower_bound"),
    "lower_bound a tensor": (_with(**_A, lower_bound=lambda a: torch.tensor(-1.0)),
                             "lower_bound"),
    "lower_bound checked without the gate": (_with(lower_bound=lambda a: 1.0), "lower_bound"),
    "safe_gate without lower_bound": (_with(**_A, safe_gate=lambda a: True),
                                      r"safe_gate=True .* needs lower_bound in \[-5, 0\)"),
    "safe_gate lower_bound below -5": (_with(**_A, safe_gate=lambda a: True,
                                             lower_bound=lambda a: -6.0),
                                       r"lower_bound in \[-5, 0\)"),
}


#: refused by the low-level entries only: the autograd entry takes a 16-bit state (as FLA)
LOW_LEVEL_ONLY = {"initial_state bf16"}


@pytest.mark.parametrize("case, entry", [(c, e) for c in CASES for e in ("fwd", "autograd")
                                          if e == "fwd" or c not in LOW_LEVEL_ONLY])
def test_bad_input_raises_before_launch(case, entry, no_launch):
    make, msg = CASES[case]
    assert_raises_unmodified(chunk_kda_det_fwd if entry == "fwd" else chunk_kda_det, make(),
                             msg)


def test_accepted_edge_arguments_do_not_raise(monkeypatch):
    """What FLA accepts passes the checks: safe_gate without the gate, lower_bound -5
    with safe_gate, A_log None with lower_bound, integer scale and lower_bound."""
    seen = []
    monkeypatch.setattr(api, "_launch_fwd", lambda *a, **k: seen.append(a) or (None, None,
                                                                               (None,) * 7))
    a = _base()
    chunk_kda_det_fwd(**a, safe_gate=True)
    chunk_kda_det_fwd(**a, scale=1, use_gate_in_kernel=True, lower_bound=-5, safe_gate=True)
    chunk_kda_det_fwd(**a, use_gate_in_kernel=True, lower_bound=-0.5,
                      dt_bias=torch.zeros(64, device=DEV))
    assert len(seen) == 3


def _saved():
    a = _base(T=10)
    _, _, saved = chunk_kda_det_fwd(**a, initial_state=torch.zeros(1, 4, 16, 16, device=DEV),
                                    output_final_state=True)
    return saved


BWD_CASES = {
    "do shape": (lambda s: (torch.zeros(1, 10, 4, 8), None), r"do: expected shape"),
    "do float64": (lambda s: (torch.zeros(1, 10, 4, 16, dtype=torch.float64), None),
                   "do: expected dtype"),
    "do not a tensor": (lambda s: (None, None), "do: expected a torch.Tensor"),
    "dht shape": (lambda s: (torch.zeros(1, 10, 4, 16), torch.zeros(2, 4, 16, 16)),
                  r"dht: expected shape \[1, 4, 16, 16\]"),
    "dht bf16": (lambda s: (torch.zeros(1, 10, 4, 16),
                            torch.zeros(1, 4, 16, 16, dtype=torch.bfloat16)),
                 "dht: expected dtype"),
    "do on meta": (lambda s: (torch.zeros(1, 10, 4, 16, device="meta"), None), "do: on meta"),
}


@pytest.mark.parametrize("case", list(BWD_CASES))
def test_bad_backward_input_raises_before_launch(case, monkeypatch):
    saved = _saved()
    make, msg = BWD_CASES[case]
    do, dht = make(saved)
    monkeypatch.setattr(api, "_launch_bwd", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ValueError, match=msg):
        chunk_kda_det_bwd(do, dht, saved)


def test_bad_backward_plan_and_workspace(monkeypatch):
    saved = _saved()
    monkeypatch.setattr(api, "_launch_bwd", lambda *a, **k: pytest.fail("launched"))
    do = torch.zeros(1, 10, 4, 16, device=DEV)
    with pytest.raises(ValueError, match="plan: made for K=32"):
        chunk_kda_det_bwd(do, None, saved, plan=make_plan(32, 16, torch.float32, DEV))
    ws = KDADetWorkspace.for_plan(saved.plan, DEV, num_v_heads=4, max_tokens=5)
    with pytest.raises(ValueError, match="workspace: holds 5 tokens"):
        chunk_kda_det_bwd(do, None, saved, workspace=ws)
    with pytest.raises(ValueError, match="saved: got dict"):
        chunk_kda_det_bwd(do, None, {"q": saved.q})


def test_make_plan_and_workspace_arguments_refused():
    with pytest.raises(ValueError, match="head_k_dim"):
        make_plan(0, 16, torch.float32, DEV)
    with pytest.raises(ValueError, match="head_v_dim"):
        make_plan(16, 512, torch.float32, DEV)
    with pytest.raises(ValueError, match="dtype"):
        make_plan(16, 16, torch.float64, DEV)
    plan = make_plan(16, 16, torch.float32, DEV)
    for kw, msg in (({"num_v_heads": 0, "max_tokens": 4}, "num_v_heads"),
                    ({"num_v_heads": 2, "max_tokens": -1}, "max_tokens"),
                    ({"num_v_heads": 2, "max_tokens": 4, "max_seqs": 0}, "max_seqs"),
                    ({"num_v_heads": True, "max_tokens": 4}, "num_v_heads"),
                    ({"num_v_heads": 2, "max_tokens": 4, "dtype": torch.float64}, "dtype")):
        with pytest.raises(ValueError, match=msg):
            KDADetWorkspace.for_plan(plan, DEV, **kw)
    with pytest.raises(ValueError, match="plan: got dict"):
        KDADetWorkspace.for_plan(plan.to_dict(), DEV, num_v_heads=2, max_tokens=4)


@pytest.mark.parametrize("fla_kw, msg", [
    (dict(chunk_size=32), "chunk_size=32 is not supported"),
    (dict(return_intermediate_states=True), "returns \\(o, final_state\\) only"),
    (dict(cp_context=object()), "kcp"),
], ids=["chunk_size", "intermediate_states", "cp_context"])
def test_fla_keyword_refusals_before_launch(fla_kw, msg, no_launch):
    """FLA's keywords at values cake does not implement: ValueError from the autograd entry
    before any launch, the caller's tensors unchanged."""
    assert_raises_unmodified(chunk_kda_det, {**_base(), **fla_kw}, msg)
