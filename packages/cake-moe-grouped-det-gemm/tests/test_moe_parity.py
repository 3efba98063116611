"""Forward, dx and dW against float64 per-expert matmuls, ragged groups and edge cases."""

import dataclasses

import pytest
import torch
from _moe_cases import DEV, make
from cake_core.testing import assert_close_to_reference
from cake_moe_grouped_det_gemm import (
    make_plan,
    moe_grouped_det_gemm,
    moe_grouped_gemm_reference,
)

# (sizes per expert, rows past the last expert's end)
CASES = {
    "ragged_empty": ([7, 0, 19, 1, 0, 13], 0),
    "one_token_experts": ([1, 1, 1, 1], 0),
    "all_on_one": ([0, 0, 33, 0], 0),
    "single_expert": ([29], 0),
    "tail_rows": ([5, 0, 11], 9),
    "all_empty_tail": ([0, 0], 6),
    "no_tokens": ([0, 0, 0], 0),
}


def _check(sizes, tail, dtype, N=20, K=24, plan=None, use_m_sizes=False):
    x, w, offs, dy = make(sizes, N, K, dtype, tail)
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    if use_m_sizes:
        m_sizes = torch.tensor(sizes, dtype=torch.int32, device=DEV)
        y = moe_grouped_det_gemm(xx, ww, m_sizes=m_sizes, plan=plan)
    else:
        y = moe_grouped_det_gemm(xx, ww, offs, plan=plan)
    y.backward(dy)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = moe_grouped_gemm_reference(x64, w64, offs, dtype=torch.float64)
    ref.backward(dy.double())
    assert y.dtype == dtype and y.shape == ref.shape
    for got, want in ((y, ref), (xx.grad, x64.grad), (ww.grad, w64.grad)):
        assert torch.isfinite(got).all()
        if want.numel() == 0 or want.abs().max() == 0:
            assert (got == 0).all()
        else:
            assert_close_to_reference(got.detach(), want.detach(), dtype)
    start = 0
    for e, m in enumerate(sizes):  # exact zeros where the math says zero
        if m == 0:
            assert (ww.grad[e] == 0).all()
        start += m
    assert (y[start:] == 0).all() and (xx.grad[start:] == 0).all()


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_cases(case):
    sizes, tail = CASES[case]
    _check(sizes, tail, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit(dtype):
    _check([7, 0, 19, 1, 13], 3, dtype)


def test_m_sizes_like_offs():
    _check([3, 0, 12, 5], 4, torch.float32, use_m_sizes=True)


def test_dims_not_multiple_of_blocks_and_small_tiles():
    """N, K odd and a plan with 16-row tiles: many tiles per expert, ragged edges."""
    sizes = [17, 0, 40, 3]
    plan = dataclasses.replace(make_plan(60, 4, 37, 45, torch.float32, DEV), block_m=16,
                               block_n=16, block_k=16, wgrad_block_m=16, wgrad_block_n=32,
                               wgrad_block_k=16)
    _check(sizes, 2, torch.float32, N=37, K=45, plan=plan)


@pytest.mark.parametrize("splits", [2, 5])
def test_split_wgrad(splits):
    sizes = [23, 0, 1, 41]
    plan = dataclasses.replace(make_plan(65, 4, 20, 24, torch.float32, DEV),
                               wgrad_splits=splits, wgrad_block_k=16)
    _check(sizes, 0, torch.float32, plan=plan)


@pytest.mark.skipif(getattr(torch, "_grouped_mm", None) is None,
                    reason="torch._grouped_mm is not in this torch")
def test_matches_torch_grouped_mm_convention():
    """Same offs convention as torch._grouped_mm (fp32 where it runs): equal rows of
    experts; rows past the last offset are zero here (torch leaves them unwritten)."""
    sizes = [6, 0, 11, 1]
    x, w, offs, dy = make(sizes, tail=4)
    try:
        want = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        want_dw = torch._grouped_mm(dy.t(), x, offs=offs)
    except (RuntimeError, NotImplementedError) as e:  # e.g. a device or dtype it lacks
        pytest.skip(f"torch._grouped_mm: {e}")
    ww = w.clone().requires_grad_()
    y = moe_grouped_det_gemm(x, ww, offs)
    y.backward(dy)
    end = sum(sizes)
    torch.testing.assert_close(y[:end], want[:end], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ww.grad, want_dw, rtol=1e-5, atol=1e-5)
