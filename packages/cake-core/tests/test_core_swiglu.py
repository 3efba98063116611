"""cake_core.swiglu: silu(g) * u forward and backward, packed (``swiglu``) and two-tensor
(``silu_mul``) layouts, against float64."""

import cake_core.swiglu as sw
import pytest
import torch
import torch.nn.functional as F
from cake_core.swiglu import silu_mul, swiglu
from cake_core.testing import (
    assert_close_to_reference,
    assert_compile_same_bits,
    assert_raises_unmodified,
    bitwise_equal,
    no_kernel_launches,
    poisoned_empty,
    randn,
    record_launches,
)
from cake_core.triton_utils import default_device

DEV = default_device()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ref_packed(h, da):
    h64 = h.detach().double().requires_grad_()
    f = h.shape[-1] // 2
    a = F.silu(h64[..., :f]) * h64[..., f:]
    a.backward(da.double())
    return a.detach(), h64.grad


@pytest.mark.parametrize("shape", [(37, 40), (3, 5, 128), (1, 2), (130, 2 * 300), (0, 8)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_matches_float64(shape, dtype):
    h = randn(shape, dtype, DEV, seed=1, scale=2.0).requires_grad_()
    before = h.detach().clone()
    a = swiglu(h)
    assert a.shape == (*shape[:-1], shape[-1] // 2) and a.dtype == dtype
    da = randn(a.shape, dtype, DEV, seed=2)
    a.backward(da)
    a64, dh64 = _ref_packed(h, da)
    assert h.grad.shape == h.shape and h.grad.dtype == dtype
    if h.numel():
        assert_close_to_reference(a, a64, dtype, name="a")
        assert_close_to_reference(h.grad, dh64, dtype, name="dh")
    assert bitwise_equal(h.detach(), before)


@pytest.mark.parametrize("shape", [(4, 0), (0,), (2, 3, 0), (0, 0)])
def test_zero_width_last_dim(shape):
    """F = 0 (``h`` ``[..., 0]``): empty results of the right shapes, not a reshape error
    (``reshape(-1, 0)`` is ambiguous)."""
    h = randn(shape, torch.float32, DEV, seed=20).requires_grad_()
    a = swiglu(h)
    assert a.shape == (*shape[:-1], 0)
    a.sum().backward()
    assert h.grad.shape == h.shape
    g = randn(shape, torch.float16, DEV, seed=21).requires_grad_()
    u = randn(shape, torch.float16, DEV, seed=22).requires_grad_()
    b = silu_mul(g, u)
    b.sum().backward()
    assert b.shape == g.shape and g.grad.shape == g.shape and u.grad.shape == u.shape


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the interpreter's exp
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_extreme_gates_fp16():
    """Large |g| (exp overflows in the sigmoid), ±inf and NaN gates give torch's fp32
    ``F.silu(g) * u`` (and its gradients) rounded to fp16, NaN where torch's is NaN."""
    vals = [-60000.0, -100.0, -20.0, -1e-3, 0.0, 20.0, 100.0, 60000.0, float("inf"),
            float("-inf"), float("nan")]
    g = torch.tensor([vals], dtype=torch.float16, device=DEV).requires_grad_()
    u = torch.tensor([[1.0, 2, 3, 4, 5, 6, 7, 0.5, 1, 1, 1]], dtype=torch.float16,
                     device=DEV).requires_grad_()
    a = silu_mul(g, u)
    a.backward(torch.ones_like(a))
    g32, u32 = (t.detach().float().requires_grad_() for t in (g, u))
    a32 = F.silu(g32) * u32
    a32.backward(torch.ones_like(a32))
    for got, want in ((a, a32), (g.grad, g32.grad), (u.grad, u32.grad)):
        torch.testing.assert_close(got, want.half(), rtol=2e-3, atol=1e-7, equal_nan=True)


def test_every_output_element_written():
    """Outputs allocated NaN-filled: the kernels must overwrite every element."""
    h = randn((45, 2 * 70), torch.float32, DEV, seed=3).requires_grad_()
    g = randn((45, 70), torch.float32, DEV, seed=4).requires_grad_()
    u = randn((45, 70), torch.float32, DEV, seed=5).requires_grad_()
    with poisoned_empty(floating_only=True):
        a = swiglu(h)
        a.backward(torch.ones_like(a))
        b = silu_mul(g, u)
        b.backward(torch.ones_like(b))
    for t in (a, h.grad, b, g.grad, u.grad):
        assert bool(torch.isfinite(t).all())


def test_strided_inputs_equal_contiguous_bits():
    """A gate/up block inside a wider row (a slice of a GEMM output) and a non-contiguous
    gradient give the bits of contiguous copies."""
    wide = randn((33, 2 * 48 + 16), torch.bfloat16, DEV, seed=6)
    h = wide[:, 8:8 + 96].requires_grad_(False).clone().requires_grad_()
    hs = wide[:, 8:8 + 96].detach().requires_grad_()  # row stride 112
    da_t = randn((48, 33), torch.bfloat16, DEV, seed=7)
    a1 = swiglu(h)
    a1.backward(da_t.t().contiguous())
    a2 = swiglu(hs)
    a2.backward(da_t.t())  # non-contiguous gradient
    assert bitwise_equal(a1, a2) and bitwise_equal(h.grad, hs.grad)


def test_repeat_bitwise():
    h = randn((64, 2 * 96), torch.bfloat16, DEV, seed=8)
    da = randn((64, 96), torch.bfloat16, DEV, seed=9)
    outs = []
    for _ in range(2):
        x = h.clone().requires_grad_()
        a = swiglu(x)
        a.backward(da)
        outs.append((a, x.grad))
    assert bitwise_equal(outs[0][0], outs[1][0]) and bitwise_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_matches_float64_and_packed_bits(dtype):
    g = randn((2, 19, 72), dtype, DEV, seed=10, scale=2.0).requires_grad_()
    u = randn((2, 19, 72), dtype, DEV, seed=11).requires_grad_()
    da = randn((2, 19, 72), dtype, DEV, seed=12)
    a = silu_mul(g, u)
    a.backward(da)
    g64, u64 = (t.detach().double().requires_grad_() for t in (g, u))
    a64 = F.silu(g64) * u64
    a64.backward(da.double())
    assert_close_to_reference(a, a64, dtype, name="a")
    assert_close_to_reference(g.grad, g64.grad, dtype, name="dg")
    assert_close_to_reference(u.grad, u64.grad, dtype, name="du")
    # the packed layout computes the same elements with the same arithmetic
    h = torch.cat([g.detach(), u.detach()], -1).requires_grad_()
    ap = swiglu(h)
    ap.backward(da)
    assert bitwise_equal(ap, a) and bitwise_equal(h.grad, torch.cat([g.grad, u.grad], -1))


def test_silu_mul_one_input_without_grad():
    g = randn((5, 16), torch.float32, DEV, seed=13).requires_grad_()
    u = randn((5, 16), torch.float32, DEV, seed=14)
    silu_mul(g, u).sum().backward()
    assert g.grad is not None and u.grad is None


def test_bad_inputs():
    """ValueError before any launch, the caller's tensors unmodified."""
    x = randn((4, 6), torch.float32, DEV)
    meta = torch.empty((4, 6), device="meta")  # a device the backend cannot launch on
    cases = [
        (swiglu, {"h": randn((4, 7), torch.float32, DEV)}, "h: the last dim must be even"),
        (swiglu, {"h": x.to(torch.int32)}, "h: expected dtype"),
        (swiglu, {"h": torch.tensor(1.0, device=DEV)}, "h: expected at least 1-D"),
        (swiglu, {"h": [1.0, 2.0]}, "h: expected a tensor"),
        (silu_mul, {"g": x, "u": randn((4, 5), torch.float32, DEV)}, "u: must match g's shape"),
        (silu_mul, {"g": x, "u": x.half()}, "u: must match g's shape"),
        (swiglu, {"h": meta}, "h: on meta"),
        (silu_mul, {"g": meta, "u": meta}, "g: on meta"),
    ]
    with no_kernel_launches(sw, "silu_mul_fwd_kernel", "silu_mul_bwd_kernel"):
        for fn, kwargs, match in cases:
            assert_raises_unmodified(fn, kwargs, match)


def test_torch_compile_fullgraph_same_bits():
    torch._dynamo.reset()
    h = randn((16, 64), torch.float32, DEV, seed=15)
    g = randn((16, 32), torch.float32, DEV, seed=16)
    assert_compile_same_bits(lambda h, g: swiglu(h) * silu_mul(g, g * 2), [h, g],
                             backend="aot_eager" if DEV.type == "cpu" else "inductor")


def test_one_dimensional_grid():
    """Both launches use a one-dimensional grid of (row blocks × column blocks) programs:
    CUDA caps a grid's second dimension at 65535, which a row of over 65535 column blocks
    (``silu_mul`` of a long 1-D tensor) would exceed; rows and column blocks both split."""
    br, bc = sw._blocks(DEV, 3 * 1024)
    h = randn((3 * br + 1, 2 * (2 * bc + 5)), torch.float32, DEV, seed=30).requires_grad_()
    with record_launches(sw, "silu_mul_fwd_kernel", "silu_mul_bwd_kernel") as launches:
        a = swiglu(h)
        da = randn(a.shape, torch.float32, DEV, seed=31)
        a.backward(da)
    grids = [grid for name in ("silu_mul_fwd_kernel", "silu_mul_bwd_kernel")
             for grid, _ in launches[name]]
    assert grids == [(4 * 3,), (4 * 3,)]
    a64, dh64 = _ref_packed(h, da)
    assert_close_to_reference(a, a64, torch.float32, name="a")
    assert_close_to_reference(h.grad, dh64, torch.float32, name="dh")


@pytest.mark.skipif(DEV.type != "cuda", reason="a grid over 65535 column blocks: CUDA only")
def test_long_row_past_cuda_grid_limit():
    n = 65536 * 1024 + 3  # over 65535 column blocks of 1024 in one row
    g = torch.full((n,), 2.0, dtype=torch.float16, device=DEV, requires_grad=True)
    u = torch.full((n,), 3.0, dtype=torch.float16, device=DEV, requires_grad=True)
    a = silu_mul(g, u)
    a.backward(torch.ones_like(a))
    want = (F.silu(torch.tensor(2.0)) * 3).half().item()
    assert a[0].item() == want and a[-1].item() == want and bool((a == want).all())
    assert bool((g.grad == g.grad[0]).all()) and bool((u.grad == u.grad[0]).all())
