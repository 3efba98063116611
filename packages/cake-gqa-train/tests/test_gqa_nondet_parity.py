"""Parity of cake-gqa-train's out, dq, dk, dv with the float64 reference (ragged packed
documents, GQA ratios 1 / 2 / 4, every head dim, seqlen_q != seqlen_k, windows, softcap)."""

import pytest
import torch
from _gqa_nd_cases import DTYPE, grads, make, reference
from cake_core.testing import TOLERANCES, assert_close_to_reference
from cake_gqa_det_train import gqa_det
from cake_gqa_train import gqa

TOL = 2e-5 if DTYPE == torch.float32 else TOLERANCES[DTYPE]
NAMES = ("out", "dq", "dk", "dv")


def _check(case, plan=None, **kw):
    got = grads(gqa, *case, plan=plan, **kw)
    want = reference(*case, **kw)
    for n, g, w in zip(NAMES, got, want, strict=True):
        assert_close_to_reference(g.double(), w, DTYPE, n, tol=TOL)
    return got


@pytest.mark.parametrize("D", [64, 128, 256])
def test_packed_ragged_each_head_dim(D):
    _check(make([0, 1, 63, 64, 65, 100], Hq=4, Hkv=2, D=D, seed=D))


@pytest.mark.parametrize("Hq,Hkv", [(2, 2), (4, 1)])
def test_gqa_ratios(Hq, Hkv):
    _check(make([70, 33], Hq=Hq, Hkv=Hkv, seed=Hq))


def test_seqlen_q_ne_k_window_softcap():
    case = make([5, 70, 4, 1], [40, 20, 0, 65], seed=3)
    _check(case)
    _check(case, causal=False, window_size=(9, 4), softcap=3.0)


@pytest.mark.parametrize("window", [(2**31 - 1, 2**31 - 1), (2**63 - 1, 0)])
def test_windows_past_every_document_are_unbounded(window):
    # as flash-attn; bounds near int32's limit must not overflow the kernels' arithmetic
    case = make([5, 70, 4, 1], [40, 20, 0, 65], seed=6)
    _check(case, causal=False, window_size=window)


def test_forward_bits_equal_det():
    """The forward is cake-gqa-det-train's kernel under equal tiles: the same bits."""
    case = make([30, 65], seed=4)
    q, k, v, _, cq, ck = case
    assert torch.equal(gqa(q, k, v, cq, ck), gqa_det(q, k, v, cq, ck))


def test_batched_layout_and_lse():
    q, k, v, _, _, _ = make([64, 64], Hq=4, Hkv=2, seed=5)
    qb, kb, vb = (t.reshape(2, 64, *t.shape[1:]) for t in (q, k, v))
    out, lse = gqa(qb, kb, vb, return_lse=True)
    assert out.shape == qb.shape and lse.shape == (2, 4, 64) and lse.dtype == torch.float32


@pytest.mark.parametrize("atomic", [0, 1])
def test_both_dkdv_kernels(atomic):
    """``bwd_atomic`` 1 (per query head, atomic adds) and 0 (cake-gqa-det-train's kernel,
    the CUDA rule's) against float64, GQA and a window."""
    import dataclasses

    from cake_gqa_train import make_plan

    case = make([5, 70, 4, 1], [40, 20, 0, 65], Hq=4, Hkv=2, seed=5)
    plan = dataclasses.replace(make_plan(64, case[0].dtype, case[0].device), bwd_atomic=atomic)
    _check(case, plan=plan)
    _check(case, causal=False, window_size=(9, 4), plan=plan)


def test_rule_picks_the_det_kernel_on_cuda():
    """CUDA: the det package's dK / dV kernel at every head dim; the interpreter runs the
    atomic one."""
    from cake_gqa_train import make_plan

    for D in (64, 128, 256):
        assert make_plan(D, torch.bfloat16, "cuda").bwd_atomic == 0
    assert make_plan(64, torch.float32, "cpu").bwd_atomic == 1
