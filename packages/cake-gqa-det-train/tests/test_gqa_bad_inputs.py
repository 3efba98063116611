"""Bad inputs to gqa_det, the low-level pair and the flash-attn entries raise ValueError
before any launch, and leave the caller's tensors with the bits they had."""

import cake_gqa_det_train.launch as launch
import pytest
import torch
from _gqa_cases import DEV, make
from cake_core.testing import args_with, assert_raises_unmodified, no_kernel_launches
from cake_gqa_det_train import (
    flash_attn_func,
    flash_attn_varlen_func,
    gqa_det,
    gqa_det_bwd,
    gqa_det_fwd,
    make_plan,
)

KERNELS = ("gqa_fwd_kernel", "gqa_bwd_delta_kernel", "gqa_bwd_dkdv_kernel",
           "gqa_bwd_dq_kernel")


@pytest.fixture
def no_launch():
    with no_kernel_launches(launch, *KERNELS):
        yield


def _packed(Hq=4, Hkv=2, D=64, dtype=torch.float32):
    """Three documents: 5/6, 20/20 and 7/3 query/key tokens."""
    c = make(lens_q=[5, 20, 7], lens_k=[6, 20, 3], Hq=Hq, Hkv=Hkv, D=D, dtype=dtype, seed=1)
    return {"q": c["q"], "k": c["k"], "v": c["v"], "cu_seqlens_q": c["cu_q"],
            "cu_seqlens_k": c["cu_k"]}


def _batched(Hq=4, Hkv=2, D=64, dtype=torch.float32):
    c = make(B=2, Sq=8, Sk=10, Hq=Hq, Hkv=Hkv, D=D, dtype=dtype, seed=2)
    return {"q": c["q"], "k": c["k"], "v": c["v"]}


def _cu(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEV)


def _strided_last(t):
    return torch.cat([t, t], -1)[..., ::2]


P, B = _packed, _batched

GQA_DET = {
    # ------------------------------------------------------------------ tensors and shapes
    "q not a tensor": (args_with(B, q=lambda a: a["q"].tolist()), "q: expected a torch.Tensor"),
    "v None": (args_with(B, v=lambda a: None), "v: expected a torch.Tensor"),
    "q 2-D": (args_with(P, q=lambda a: a["q"][:, 0]), r"q: expected \[B, S, H, D\] or packed"),
    "q 5-D": (args_with(B, q=lambda a: a["q"][None]), r"q: expected \[B, S, H, D\] or packed"),
    "k 3-D while q 4-D": (args_with(B, k=lambda a: a["k"][0]), "k: expected 4-D like q"),
    "v 4-D while q 3-D": (args_with(P, v=lambda a: a["v"][None]), "v: expected 3-D like q"),
    "k, v shapes differ (packed)": (args_with(P, v=lambda a: a["v"][:-1]),
                                    r"v: expected k's shape \[29, 2, 64\], got \[28, 2, 64\]"),
    "k, v heads differ": (args_with(B, v=lambda a: a["v"][:, :, :1]), "v: expected k's shape"),
    "k, v shapes differ (batched)": (args_with(B, k=lambda a: a["k"][:, :9]),
                                     "v: expected k's shape"),
    "batch differs": (args_with(B, k=lambda a: a["k"][:1], v=lambda a: a["v"][:1]),
                      "k: batch 1 differs from q's 2"),
    "Hq not a multiple of Hkv": (args_with(P, q=lambda a: a["q"][:, :3]),
                                 r"query heads \(3\) must be a positive multiple of KV heads "
                                 r"\(2\)"),
    "Hkv > Hq": (args_with(B, base={"Hq": 2, "Hkv": 2}, q=lambda a: a["q"][:, :, :1]),
                 r"query heads \(1\) must be a positive multiple of KV heads \(2\)"),
    "no KV heads": (args_with(P, k=lambda a: a["k"][:, :0], v=lambda a: a["v"][:, :0]),
                    r"query heads \(4\) must be a positive multiple of KV heads \(0\)"),
    "head dim 96": (args_with(P, q=lambda a: a["q"][..., :96], k=lambda a: a["k"][..., :96],
                              v=lambda a: a["v"][..., :96], base={"D": 128}),
                    "q: head dim 96 is not served"),
    "head dim 32": (args_with(B, q=lambda a: a["q"][..., :32], k=lambda a: a["k"][..., :32],
                              v=lambda a: a["v"][..., :32]),
                    "q: head dim 32 is not served"),
    "q, k head dims differ": (args_with(P, k=lambda a: torch.cat([a["k"], a["k"]], -1),
                                        v=lambda a: torch.cat([a["v"], a["v"]], -1)),
                              r"k, v: head dims must equal q's \(64\), got k 128, v 128"),
    "v head dim differs": (args_with(B, base={"D": 128}, v=lambda a: a["v"][..., :64]),
                           r"k, v: head dims must equal q's \(128\), got k 128, v 64"),
    # ------------------------------------------------------------------ dtypes and devices
    "k bf16, q fp32": (args_with(P, k=lambda a: a["k"].bfloat16()),
                       r"k: expected dtype in \(float32\), got bfloat16"),
    "v fp16, q bf16": (args_with(B, base={"dtype": torch.bfloat16},
                                 v=lambda a: a["v"].half()),
                       r"v: expected dtype in \(bfloat16\), got float16"),
    "int32 inputs": (args_with(P, q=lambda a: a["q"].int(), k=lambda a: a["k"].int(),
                               v=lambda a: a["v"].int()), "q: expected dtype in .*got int32"),
    "fp64 inputs": (args_with(B, q=lambda a: a["q"].double(), k=lambda a: a["k"].double(),
                              v=lambda a: a["v"].double()), "q: expected dtype in .*float64"),
    "k on another device": (args_with(P, k=lambda a: a["k"].to("meta")),
                            "k: on meta, but q is on"),
    "q last dim strided": (args_with(P, q=lambda a: _strided_last(a["q"])),
                           "q: last dimension must be contiguous"),
    "v last dim strided": (args_with(B, v=lambda a: _strided_last(a["v"])),
                           "v: last dimension must be contiguous"),
    "k transposed (head dim not last)": (
        args_with(B, k=lambda a: a["k"].transpose(-1, -2).contiguous().transpose(-1, -2)),
        "k: last dimension must be contiguous"),
    # ------------------------------------------------------------------ offsets
    "cu_seqlens_k other doc count": (args_with(P, cu_seqlens_k=lambda a: _cu(0, 9, 29)),
                                     "cu_seqlens_k: 2 documents, cu_seqlens_q has 3"),
    "cu_seqlens_q unsorted": (args_with(P, cu_seqlens_q=lambda a: _cu(0, 25, 5, 32)),
                              "cu_seqlens_q: must be non-decreasing"),
    "cu_seqlens_k unsorted": (args_with(P, cu_seqlens_k=lambda a: _cu(0, 6, 3, 29)),
                              "cu_seqlens_k: must be non-decreasing"),
    "cu_seqlens_q not from 0": (args_with(P, cu_seqlens_q=lambda a: _cu(1, 5, 25, 32)),
                                "cu_seqlens_q: must start at 0, got 1"),
    "cu_seqlens_q not to Tq": (args_with(P, cu_seqlens_q=lambda a: _cu(0, 5, 25, 31)),
                               "cu_seqlens_q: must end at the token count 32, got 31"),
    "cu_seqlens_k past Tk": (args_with(P, cu_seqlens_k=lambda a: _cu(0, 6, 26, 30)),
                             "cu_seqlens_k: must end at the token count 29, got 30"),
    "cu_seqlens_q float": (args_with(P, cu_seqlens_q=lambda a: a["cu_seqlens_q"].float()),
                           r"cu_seqlens_q: expected dtype in \(int32, int64\)"),
    "cu_seqlens_k int16": (args_with(P, cu_seqlens_k=lambda a: a["cu_seqlens_k"].short()),
                           r"cu_seqlens_k: expected dtype in \(int32, int64\)"),
    "cu_seqlens_q 2-D": (args_with(P, cu_seqlens_q=lambda a: a["cu_seqlens_q"][None]),
                         "cu_seqlens_q: expected 1-D"),
    "cu_seqlens_q one entry": (args_with(P, cu_seqlens_q=lambda a: _cu(0),
                                         cu_seqlens_k=lambda a: None),
                               "cu_seqlens_q: expected at least 2 entries"),
    "cu_seqlens_q a list": (args_with(P, cu_seqlens_q=lambda a: [0, 5, 25, 32]),
                            "cu_seqlens_q: expected a torch.Tensor"),
    "cu_seqlens_q on meta": (args_with(P, cu_seqlens_q=lambda a: a["cu_seqlens_q"].to("meta")),
                             "cu_seqlens_q: on meta"),
    "cu_seqlens_q with 4-D input": (args_with(B, cu_seqlens_q=lambda a: _cu(0, 8, 16)),
                                    r"only for packed \[T, H, D\] input"),
    "cu_seqlens_k with 4-D input": (args_with(B, cu_seqlens_k=lambda a: _cu(0, 10, 20)),
                                    r"only for packed \[T, H, D\] input"),
    "packed without cu_seqlens_q": (args_with(P, cu_seqlens_q=lambda a: None,
                                              cu_seqlens_k=lambda a: None),
                                    r"cu_seqlens_q: packed \[T, H, D\] input needs offsets"),
    "packed with cu_seqlens_k only": (args_with(P, cu_seqlens_q=lambda a: None),
                                      "cu_seqlens_q: packed .* needs offsets"),
    "cu_seqlens_k defaults to q's, Tk differs": (
        args_with(P, cu_seqlens_k=lambda a: None),
        "cu_seqlens_k: must end at the token count 29, got 32"),
    # ------------------------------------------------------------------ max lengths
    "max_seqlen_q below longest": (args_with(P, max_seqlen_q=lambda a: 19),
                                   r"max_seqlen_q: 19 is below the longest document \(20\)"),
    "max_seqlen_k below longest": (args_with(P, max_seqlen_k=lambda a: 0),
                                   r"max_seqlen_k: 0 is below the longest document \(20\)"),
    "max_seqlen_q negative": (args_with(P, max_seqlen_q=lambda a: -1),
                              "max_seqlen_q: expected an int >= 0 or None, got -1"),
    "max_seqlen_k bool": (args_with(P, max_seqlen_k=lambda a: True),
                          "max_seqlen_k: expected an int >= 0 or None, got True"),
    "max_seqlen_q float": (args_with(P, max_seqlen_q=lambda a: 20.0),
                           "max_seqlen_q: expected an int >= 0 or None, got 20.0"),
    "max_seqlen_q a tensor": (args_with(P, max_seqlen_q=lambda a: torch.tensor(20)),
                              "max_seqlen_q: expected an int >= 0 or None"),
    "max_seqlen_q negative (batched)": (args_with(B, max_seqlen_q=lambda a: -2),
                                        "max_seqlen_q: expected an int >= 0"),
    # ------------------------------------------------------------------ options
    "window not a pair (3)": (args_with(P, window_size=lambda a: (1, 2, 3)),
                              r"window_size: expected a pair of ints >= -1"),
    "window an int": (args_with(B, window_size=lambda a: 4), "window_size: expected a pair"),
    "window < -1": (args_with(P, window_size=lambda a: (-2, 0)), "window_size: expected a pair"),
    "window right < -1": (args_with(B, window_size=lambda a: (3, -5), causal=lambda a: False),
                          "window_size: expected a pair"),
    "window bool": (args_with(P, window_size=lambda a: (True, 0)),
                    "window_size: expected a pair"),
    "window float": (args_with(P, window_size=lambda a: (4.0, 0)),
                     "window_size: expected a pair"),
    "window None": (args_with(B, window_size=lambda a: None), "window_size: expected a pair"),
    "softcap negative": (args_with(P, softcap=lambda a: -1.0),
                         "softcap: expected a finite number >= 0"),
    "softcap inf": (args_with(B, softcap=lambda a: float("inf")),
                    "softcap: expected a finite number >= 0"),
    "softcap nan": (args_with(P, softcap=lambda a: float("nan")), "softcap: expected a finite"),
    "softcap bool": (args_with(P, softcap=lambda a: True), "softcap: expected a finite"),
    "softcap None": (args_with(B, softcap=lambda a: None), "softcap: expected a finite"),
    "softmax_scale 0": (args_with(P, softmax_scale=lambda a: 0.0),
                        "softmax_scale: expected a finite number > 0 or None"),
    "softmax_scale negative": (args_with(B, softmax_scale=lambda a: -0.125),
                               "softmax_scale: expected a finite number > 0"),
    "softmax_scale nan": (args_with(P, softmax_scale=lambda a: float("nan")),
                          "softmax_scale: expected a finite number > 0"),
    "softmax_scale inf": (args_with(P, softmax_scale=lambda a: float("inf")),
                          "softmax_scale: expected a finite number > 0"),
    "softmax_scale bool": (args_with(B, softmax_scale=lambda a: True),
                           "softmax_scale: expected a finite number > 0"),
    "softmax_scale str": (args_with(P, softmax_scale=lambda a: "0.1"),
                          "softmax_scale: expected a finite number > 0"),
    "causal int": (args_with(P, causal=lambda a: 1), "causal: expected a bool, got 1"),
    "causal None": (args_with(B, causal=lambda a: None), "causal: expected a bool, got None"),
    "causal a tensor": (args_with(B, causal=lambda a: torch.tensor(True)),
                        "causal: expected a bool"),
    "return_lse int": (args_with(P, return_lse=lambda a: 1), "return_lse: expected a bool, got 1"),
    "return_lse str": (args_with(B, return_lse=lambda a: "yes"), "return_lse: expected a bool"),
    # ------------------------------------------------------------------ plan
    "plan of another head dim": (args_with(P, plan=lambda a: make_plan(128, torch.float32, DEV)),
                                 "plan: made for head_dim=128, inputs have 64"),
    "plan of another head dim (batched)": (
        args_with(B, base={"D": 256}, plan=lambda a: make_plan(64, torch.float32, DEV)),
        "plan: made for head_dim=64, inputs have 256"),
    "plan of wrong type": (args_with(P, plan=lambda a: object()),
                           r"plan: got object \(mode=none\), expected GQADetPlan with mode=det"),
    "plan a dict": (args_with(B, plan=lambda a: make_plan(64, torch.float32, DEV).to_dict()),
                    "plan: got dict"),
    "workspace of wrong type": (args_with(P, workspace=lambda a: torch.zeros(1000)),
                                "workspace: got Tensor"),
}


@pytest.mark.parametrize("case", list(GQA_DET))
def test_gqa_det_bad_input(case, no_launch):
    make_args, msg = GQA_DET[case]
    assert_raises_unmodified(gqa_det, make_args(), msg)


@pytest.mark.parametrize("case", ["k, v shapes differ (packed)", "cu_seqlens_q unsorted",
                                  "max_seqlen_q below longest", "softcap negative",
                                  "q last dim strided", "plan of another head dim",
                                  "batch differs", "window bool"])
def test_gqa_det_fwd_same_refusals(case, no_launch):
    """The low-level forward runs the same checks (those that take no return_lse /
    workspace)."""
    make_args, msg = GQA_DET[case]
    assert_raises_unmodified(gqa_det_fwd, make_args(), msg)


def test_leaves_requiring_grad_unmodified_and_gradless(no_launch):
    """A refused call leaves leaves requiring grad without a gradient or graph."""
    a = _packed()
    a = {n: t.clone().requires_grad_() if n in "qkv" else t for n, t in a.items()}
    assert_raises_unmodified(gqa_det, dict(a, softcap=-1.0), "softcap")
    assert all(a[n].grad is None for n in "qkv")


FA = {
    "dropout_p > 0": (args_with(B, dropout_p=lambda a: 0.1),
                      "dropout_p: attention dropout is not served, got 0.1"),
    "dropout_p nan": (args_with(B, dropout_p=lambda a: float("nan")), "dropout_p"),
    "alibi_slopes": (args_with(B, alibi_slopes=lambda a: torch.zeros(4, device=DEV)),
                     "alibi_slopes: ALiBi is not served"),
    "return_attn_probs": (args_with(B, return_attn_probs=lambda a: True),
                          "return_attn_probs: attention probabilities are not returned"),
    "deterministic 2": (args_with(B, deterministic=lambda a: 2),
                        "deterministic: expected a bool, got 2"),
    "3-D q": (args_with(P, cu_seqlens_q=lambda a: None, cu_seqlens_k=lambda a: None),
              r"q: flash_attn_func takes \[B, S, H, D\]"),
    "q not a tensor": (args_with(B, q=lambda a: None), r"q: flash_attn_func takes"),
    "causal 2": (args_with(B, causal=lambda a: 2), "causal: expected a bool"),
    "k batch differs": (args_with(B, k=lambda a: a["k"][:1], v=lambda a: a["v"][:1]),
                        "k: batch 1 differs"),
}


def _fa_args(make_args):
    a = make_args()
    a.pop("cu_seqlens_q", None)
    a.pop("cu_seqlens_k", None)
    return a


@pytest.mark.parametrize("case", list(FA))
def test_flash_attn_func_bad_input(case, no_launch):
    make_args, msg = FA[case]
    assert_raises_unmodified(flash_attn_func, _fa_args(make_args), msg)


def _varlen(**changes):
    def make_args():
        a = _packed()
        a["max_seqlen_q"], a["max_seqlen_k"] = 20, 20
        for n, fn in changes.items():
            a[n] = fn(a)
        return a
    return make_args


FA_VARLEN = {
    "dropout_p > 0": (_varlen(dropout_p=lambda a: 0.5), "dropout_p: attention dropout"),
    "alibi_slopes": (_varlen(alibi_slopes=lambda a: torch.zeros(3, 4)), "alibi_slopes"),
    "return_attn_probs": (_varlen(return_attn_probs=lambda a: True), "return_attn_probs"),
    "deterministic None": (_varlen(deterministic=lambda a: None), "deterministic: expected"),
    "block_table": (_varlen(block_table=lambda a: torch.zeros(3, 1, dtype=torch.int32)),
                    "block_table: paged KV caches are not served"),
    "4-D q": (_varlen(q=lambda a: a["q"][None], k=lambda a: a["k"][None],
                      v=lambda a: a["v"][None]),
              r"q: flash_attn_varlen_func takes packed \[T, H, D\]"),
    "cu_seqlens_k None": (_varlen(cu_seqlens_k=lambda a: None),
                          "cu_seqlens_k: required by flash_attn_varlen_func"),
    "cu_seqlens_q None": (_varlen(cu_seqlens_q=lambda a: None),
                          "cu_seqlens_q: packed .* needs offsets"),
    "max_seqlen_q too small": (_varlen(max_seqlen_q=lambda a: 7),
                               r"max_seqlen_q: 7 is below the longest document \(20\)"),
    "max_seqlen_k a float": (_varlen(max_seqlen_k=lambda a: 20.5), "max_seqlen_k: expected"),
    "offsets unsorted": (_varlen(cu_seqlens_k=lambda a: _cu(0, 20, 6, 29)),
                         "cu_seqlens_k: must be non-decreasing"),
    "window bad": (_varlen(window_size=lambda a: (-3, -1)), "window_size"),
}


@pytest.mark.parametrize("case", list(FA_VARLEN))
def test_flash_attn_varlen_func_bad_input(case, no_launch):
    make_args, msg = FA_VARLEN[case]
    assert_raises_unmodified(flash_attn_varlen_func, make_args(), msg)


def test_bwd_bad_dout_refused_before_launch():
    """gqa_det_bwd: a dout of another shape, dtype or device, or not a tensor."""
    out, _, saved = gqa_det_fwd(**_packed())
    do = torch.ones_like(out)
    bad = {
        r"dout: expected shape \[32, 4, 64\], got \[31, 4, 64\]": do[:-1],
        r"dout: expected shape .* got \[32, 4\]": do[..., 0],
        r"dout: expected dtype in \(float32\), got bfloat16": do.bfloat16(),
        "dout: expected a torch.Tensor": do.tolist(),
        "dout: on meta": do.to("meta"),
    }
    with no_kernel_launches(launch, *KERNELS):
        for msg, dout in bad.items():
            assert_raises_unmodified(gqa_det_bwd, {"dout": dout, "saved": saved}, msg)


def test_meta_inputs_refused_before_launch(no_launch):
    """All on one device, but not one the interpreter runs on."""
    if DEV.type != "cpu":
        pytest.skip("interpreter-only check")
    a = {n: t.to("meta") for n, t in _batched().items()}
    with pytest.raises(ValueError, match="q: on meta"):
        gqa_det(**a)


def test_no_launch_stand_ins_catch_a_launch(no_launch):
    """The stand-ins are where the launches look: a good call trips them (so the refusals
    above did come before any launch)."""
    with pytest.raises(AssertionError, match=r"a kernel was launched \(gqa_fwd_kernel\)"):
        gqa_det(**_packed())
