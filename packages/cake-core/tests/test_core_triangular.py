"""cake_core.triangular.unit_lower_inverse against float64 torch."""

import pytest
import torch
from cake_core.triangular import unit_lower_inverse
from cake_core.triton_utils import default_device, is_interpreting, tl, triton


@triton.jit
def _inverse_kernel(A, T, BT: tl.constexpr, LOG2_BT: tl.constexpr, PREC: tl.constexpr):
    rows = tl.arange(0, BT)
    off = rows[:, None] * BT + rows[None, :]
    a = tl.load(A + off)
    tl.store(T + off, unit_lower_inverse(a, BT, LOG2_BT, PREC))


@pytest.mark.parametrize("BT", [16, 32, 64])
def test_unit_lower_inverse_matches_float64(BT):
    dev = default_device()
    gen = torch.Generator().manual_seed(BT)
    a = torch.tril(torch.randn(BT, BT, generator=gen, dtype=torch.float64), -1) * 0.3
    t = torch.full((BT, BT), float("nan"), dtype=torch.float32, device=dev)  # poisoned
    prec = "ieee" if is_interpreting() else "tf32x3"
    _inverse_kernel[(1,)](a.float().to(dev), t, BT=BT, LOG2_BT=BT.bit_length() - 1,
                          PREC=prec)
    want = torch.linalg.inv(torch.eye(BT, dtype=torch.float64) + a)
    assert torch.allclose(t.cpu().double(), want, rtol=1e-4, atol=1e-5)
    assert torch.equal(torch.triu(t.cpu(), 1), torch.zeros(BT, BT))
