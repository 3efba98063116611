"""cake-gqa-train's own refusals (and a sample of the shared ones) are ValueErrors raised
before any launch, with the caller's tensors unchanged."""

import cake_gqa_det_train.launch as det_launch
import cake_gqa_train as nd
import cake_gqa_train.api as nd_api
import pytest
import torch
from _gqa_nd_cases import DEV, make
from cake_core.testing import assert_raises_unmodified, no_kernel_launches


def _base():
    q, k, v, _, cq, ck = make([20, 45], seed=9)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}


def _plan():
    return nd.make_plan(64, _base()["q"].dtype, DEV)


CASES = {
    "det plan": (lambda a: {**a, "plan": __import__("cake_gqa_det_train").make_plan(
        64, a["q"].dtype, DEV)}, "plan: got GQADetPlan"),
    "plan of another head dim": (lambda a: {**a, "plan": nd.make_plan(128, a["q"].dtype, DEV)},
                                 "plan: made for head_dim=128"),
    "workspace too small": (lambda a: {**a, "plan": _plan(), "workspace": nd.GQAWorkspace
                                       .for_plan(_plan(), DEV, 4, 10, 2, 65)},
                            "workspace: 'delta' must be"),
    "GQA ratio": (lambda a: {**a, "k": a["k"][:, :1].expand(-1, 3, -1).contiguous(),
                             "v": a["v"][:, :1].expand(-1, 3, -1).contiguous()},
                  "positive multiple"),
    "unsorted offsets": (lambda a: {**a, "cu_seqlens_q": torch.tensor(
        [0, 50, 45], dtype=torch.int32, device=DEV)}, "non-decreasing"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gqa_refusals_before_launch(name):
    change, match = CASES[name]
    with no_kernel_launches(det_launch, "gqa_fwd_kernel", "gqa_bwd_delta_kernel",
                            "gqa_bwd_dq_kernel"), \
            no_kernel_launches(nd_api, "gqa_bwd_dkdv_atomic_kernel"):
        assert_raises_unmodified(nd.gqa, change(_base()), match)


@pytest.mark.parametrize("kw,match", [(dict(deterministic=True), "cake_gqa_det_train"),
                                      (dict(dropout_p=0.5), "dropout_p"),
                                      (dict(block_table=torch.zeros(1)), "block_table")])
def test_flash_attn_refusals_before_launch(kw, match):
    a = _base()
    args = dict(q=a["q"], k=a["k"], v=a["v"], cu_seqlens_q=a["cu_seqlens_q"],
                cu_seqlens_k=a["cu_seqlens_k"], max_seqlen_q=45, max_seqlen_k=45, **kw)
    with no_kernel_launches(det_launch, "gqa_fwd_kernel"):
        assert_raises_unmodified(nd.flash_attn_varlen_func, args, match)
