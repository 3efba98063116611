"""Every plan configuration, not only the default, against the float64 reference.

Triton miscompiles have hit other kernels on Hopper for some configurations only, so the
sweep covers tile heights, warp counts, program counts and reduce tiles.
"""

import dataclasses

import pytest
import torch
from cake_core.testing import assert_close_to_reference, randn
from cake_core.triton_utils import default_device
from cake_rmsnorm_det_train import (
    RMSNormDetWorkspace,
    make_plan,
    rmsnorm_det,
    rmsnorm_reference,
)

DEV = default_device()

VARIANTS = {
    "default": {},
    "one-row-one-program": dict(block_m_fwd=1, block_m_bwd=1, bwd_programs=1, reduce_block_p=1),
    "tall-tiles-few-warps": dict(block_m_fwd=8, num_warps_fwd=1, block_m_bwd=4,
                                 num_warps_bwd=2, bwd_programs=7, reduce_block_p=4),
    "many-warps-many-programs": dict(num_warps_fwd=16, num_warps_bwd=16, bwd_programs=300,
                                     reduce_block_p=32, reduce_block_c=32),
    "odd-programs-wide-reduce": dict(num_warps_fwd=4, num_warps_bwd=8, bwd_programs=133,
                                     reduce_block_p=8, reduce_block_c=1024),
}

# (H, rows). On the GPU the tiny shapes give way to large ones: each plan configuration is
# a fresh Triton compile there, so the sweep is kept to what it must cover.
SHAPES = [(7, 5), (1000, 129), (4096, 67)]
if DEV.type == "cuda":
    SHAPES = [(1000, 129), (8192, 4096), (20000, 512), (16384, 1024)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("H,rows", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_plan_variant_matches_float64(variant, H, rows, dtype):
    base = make_plan(H, dtype, DEV)
    kw = dict(VARIANTS[variant])
    # keep tiles within 16384 elements so a row tile fits the register file
    for k in ("block_m_fwd", "block_m_bwd"):
        if k in kw:
            kw[k] = max(1, min(kw[k], 16384 // base.block_h))
    if DEV.type == "cpu" and "bwd_programs" in kw:  # the interpreter pays per program
        kw["bwd_programs"] = min(kw["bwd_programs"], 9)
    kw["reduce_block_c"] = min(kw.get("reduce_block_c", base.reduce_block_c), base.block_h)
    plan = dataclasses.replace(base, **kw)
    ws = RMSNormDetWorkspace.for_plan(plan, DEV)
    x = randn((rows, H), dtype, DEV, seed=rows + H).requires_grad_()
    r = randn((rows, H), dtype, DEV, seed=rows + H + 1).requires_grad_()
    w = randn((H,), dtype, DEV, seed=H, scale=0.3).add_(1).requires_grad_()
    dy = randn((rows, H), dtype, DEV, seed=3)
    dh = randn((rows, H), dtype, DEV, seed=4)
    y, h = rmsnorm_det(x, w, 1e-6, residual=r, plan=plan, workspace=ws)
    torch.autograd.backward([y, h], [dy, dh])
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    y64, h64 = rmsnorm_reference(x64, w64, 1e-6, r64, dtype=torch.float64)
    torch.autograd.backward([y64, h64], [dy.double(), dh.double()])
    assert_close_to_reference(y, y64, dtype, "y")
    assert_close_to_reference(x.grad, x64.grad, dtype, "dx")
    assert_close_to_reference(r.grad, r64.grad, dtype, "dresidual")
    assert_close_to_reference(w.grad, w64.grad, dtype, "dweight")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("H", [7, 64, 1000])
def test_one_row_forward_without_residual(H, dtype):
    """One-row forward tiles (the CUDA default for H >= 4096), no residual."""
    plan = dataclasses.replace(make_plan(H, dtype, DEV), block_m_fwd=1)
    x = randn((37, H), dtype, DEV, seed=H + 5).requires_grad_()
    w = randn((H,), dtype, DEV, seed=H, scale=0.3).add_(1).requires_grad_()
    y = rmsnorm_det(x, w, 1e-6, plan=plan)
    y.backward(randn((37, H), dtype, DEV, seed=6))
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    ref = rmsnorm_reference(x64, w64, 1e-6)
    ref.backward(randn((37, H), dtype, DEV, seed=6).double())
    for name, a, r in (("y", y, ref), ("dx", x.grad, x64.grad), ("dweight", w.grad, w64.grad)):
        assert_close_to_reference(a, r, dtype, name)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_forward_64bit_offsets_equal_32bit(residual):
    """The forward's 64-bit row offsets (taken where an offset reaches 2**31 elements, too
    large to allocate in a test) give the bits of the 32-bit path, with and without the
    residual, on a shape with a masked last tile."""
    from cake_rmsnorm_det_train.kernels.fwd import rmsnorm_fwd_kernel

    H, rows, dtype = 1000, 37, torch.bfloat16
    plan = dataclasses.replace(make_plan(H, dtype, DEV), block_m_fwd=4)
    x = randn((rows, H), dtype, DEV, seed=3)
    r = randn((rows, H), dtype, DEV, seed=4)
    w = randn((H,), dtype, DEV, seed=5, scale=0.3).add_(1)
    outs = []
    for off64 in (False, True):
        y, h = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        rstd = torch.full((rows,), float("nan"), device=DEV)
        rmsnorm_fwd_kernel[(-(-rows // plan.block_m_fwd),)](
            x, r, w, y, h, rstd, rows, H, H, H, H, H, 1e-6, HAS_RESIDUAL=residual,
            BLOCK_M=plan.block_m_fwd, BLOCK_H=plan.block_h, OFF64=off64,
            num_warps=plan.num_warps_fwd)
        outs.append((y, h, rstd) if residual else (y, rstd))
    for a, b in zip(*outs, strict=True):
        assert not a.isnan().any() and torch.equal(a, b)
    want = rmsnorm_reference((x + r if residual else x).double(), w.double(), 1e-6)
    assert_close_to_reference(outs[0][0], want, dtype, "y")
