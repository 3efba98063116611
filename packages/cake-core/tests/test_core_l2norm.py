"""cake_core.l2norm: the row-wise L2 norm kernels, forward and backward."""

import pytest
import torch
from cake_core.l2norm import L2NORM_EPS, l2norm_bwd, l2norm_fwd
from cake_core.testing import (
    assert_bitwise_repeat,
    assert_close_to_reference,
    bitwise_equal,
    randn,
)
from cake_core.triton_utils import default_device

DEV = default_device()
LAUNCH = {"block_rows": 16, "num_warps": 4}


def _ref(x64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = torch.rsqrt(x64.pow(2).sum(-1) + L2NORM_EPS)
    return x64 * rstd[..., None], rstd


@pytest.mark.parametrize("shape,block_k", [
    ((2, 7, 3, 16), 16),     # 42 rows: not a multiple of block_rows
    ((1, 5, 2, 100), 128),   # K not a power of two, masked columns
    ((33, 64), 64),
    ((1, 1, 1, 8), 16),      # one row
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fwd_matches_float64(shape, block_k, dtype):
    x = randn(shape, dtype, DEV, seed=3)
    before = x.clone()
    y, rstd = l2norm_fwd(x, block_k=block_k, **LAUNCH)
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    y_ref, rstd_ref = _ref(x.double())
    assert_close_to_reference(y, y_ref, dtype, name="y")
    assert_close_to_reference(rstd, rstd_ref, torch.float32, name="rstd")
    assert bitwise_equal(x, before)


def test_fwd_small_rows_use_eps():
    x = torch.zeros(3, 16, device=DEV)
    x[1, 0] = 1e-4
    y, rstd = l2norm_fwd(x, block_k=16, **LAUNCH)
    assert torch.equal(y[0], torch.zeros(16, device=DEV))
    want = 1.0 / (1e-8 + L2NORM_EPS) ** 0.5
    assert abs(float(rstd[0]) - L2NORM_EPS ** -0.5) <= 1e-5 * L2NORM_EPS ** -0.5
    assert abs(float(rstd[1]) - want) <= 1e-5 * want


def test_fwd_repeat_and_launch_parameters():
    x = randn((4, 9, 2, 32), torch.bfloat16, DEV, seed=5)
    assert_bitwise_repeat(lambda: l2norm_fwd(x, block_k=32, **LAUNCH), repeats=2)
    # rows are independent: a row gives the same bits wherever it sits in a row block
    # (same launch parameters; other warps may sum a row in another order on a GPU)
    a = l2norm_fwd(x, block_k=32, block_rows=16, num_warps=4)
    b = l2norm_fwd(x[1:], block_k=32, block_rows=16, num_warps=4)  # rows shifted by 18
    assert bitwise_equal(a[0][1:], b[0]) and bitwise_equal(a[1][1:], b[1])


def test_fwd_no_rows():
    x = torch.empty(0, 3, 16, device=DEV)
    y, rstd = l2norm_fwd(x, block_k=16, **LAUNCH)
    assert y.shape == (0, 3, 16) and rstd.shape == (0, 3) and rstd.dtype == torch.float32


def test_fwd_bad_arguments():
    x = randn((8, 32), torch.float32, DEV)
    with pytest.raises(ValueError, match="x: must be contiguous"):
        l2norm_fwd(randn((32, 8), torch.float32, DEV).t(), block_k=32, **LAUNCH)
    with pytest.raises(ValueError, match="block_k: must be >= K = 32, got 16"):
        l2norm_fwd(x, block_k=16, **LAUNCH)


@pytest.mark.parametrize("shape,block_k", [((2, 11, 3, 24), 32), ((37, 100), 128), ((1, 8), 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bwd_matches_float64(shape, block_k, dtype):
    x = randn(shape, dtype, DEV, seed=7)
    dy = randn(shape, torch.float32, DEV, seed=8)
    y, rstd = l2norm_fwd(x, block_k=block_k, **LAUNCH)
    dx = l2norm_bwd(y, rstd, dy, block_k=block_k, out_dtype=torch.float32, **LAUNCH)
    assert dx.dtype == torch.float32 and dx.shape == shape
    # the formula on the stored y (any dtype: exact in fp32) and fp32 rstd, in float64: only
    # fp32 rounding separates dx from it
    y64, r64 = y.double(), rstd.double()[..., None]
    want = r64 * (dy.double() - y64 * (dy.double() * y64).sum(-1, keepdim=True))
    assert_close_to_reference(dx, want, torch.float32, name="dx")
    # and the true gradient, within the rounding of the stored y
    x64 = x.double().requires_grad_(True)
    (g64,) = torch.autograd.grad(_ref(x64)[0], x64, dy.double())
    assert_close_to_reference(dx, g64, dtype, name="dx")
    assert bitwise_equal(l2norm_bwd(y, rstd, dy, block_k=block_k, out_dtype=torch.float32,
                                    **LAUNCH), dx)
    lo = l2norm_bwd(y, rstd, dy, block_k=block_k, **LAUNCH)  # default: y's dtype
    # the in-kernel cast (the interpreter's rounding may differ from torch's by one ulp)
    assert lo.dtype == dtype
    torch.testing.assert_close(lo.float(), dx, rtol=2 ** -7, atol=1e-6)


def test_bwd_rows_independent_and_strided_inputs():
    """A row's dx does not depend on which program holds it (rows shifted by one), and a
    non-contiguous dy gives the bits of its contiguous copy."""
    x = randn((45, 32), torch.float32, DEV, seed=1)
    dy = randn((32, 45), torch.float32, DEV, seed=2).t()
    y, rstd = l2norm_fwd(x, block_k=32, **LAUNCH)
    a = l2norm_bwd(y, rstd, dy, block_k=32, **LAUNCH)
    assert bitwise_equal(a, l2norm_bwd(y, rstd, dy.contiguous(), block_k=32, **LAUNCH))
    b = l2norm_bwd(y[1:], rstd[1:], dy[1:], block_k=32, **LAUNCH)
    assert bitwise_equal(a[1:], b)
    assert l2norm_bwd(y[:0], rstd[:0], dy[:0], block_k=32, **LAUNCH).shape == (0, 32)
    with pytest.raises(ValueError, match="block_k"):
        l2norm_bwd(y, rstd, dy, block_k=16, **LAUNCH)
