"""cake_core.gemm: the shared strided split-K matmul and the ordered sum (interpreter on CPU)."""

import pytest
import torch
from cake_core.gemm import matmul, ordered_sum, tma_available
from cake_core.testing import assert_close_to_reference, bitwise_equal, poison_, randn
from cake_core.triton_utils import default_device

DEV = default_device()
TILES = dict(block_m=32, block_n=32, block_k=16, group_m=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matmul_strided_bias_and_poison(dtype):
    a = randn((70, 45), dtype, DEV, seed=1)
    bt = randn((37, 45), dtype, DEV, seed=2)   # b = bt.t(): a transposed view, no copy
    bias = randn((37,), dtype, DEV, seed=3)
    out = poison_(torch.empty(70, 37, dtype=dtype, device=DEV))
    matmul(a, bt.t(), out, bias=bias, **TILES)  # 3×2 tiles, GROUP_M=2: a ragged last group
    ref = a.double() @ bt.double().t() + bias.double()
    assert_close_to_reference(out, ref, dtype, "out")
    out_t = poison_(torch.empty(37, 70, dtype=dtype, device=DEV)).t()  # strided output
    matmul(a, bt.t(), out_t, bias=bias, **TILES)
    assert bitwise_equal(out_t.contiguous(), out)


@pytest.mark.parametrize("split", [1, 2, 5])
def test_matmul_split_and_accumulate(split):
    a = randn((20, 150), torch.bfloat16, DEV, seed=4)
    b = randn((150, 24), torch.bfloat16, DEV, seed=5)
    ref = a.double() @ b.double()
    parts = poison_(torch.empty(split, 20, 24, device=DEV)) if split > 1 else None
    out = poison_(torch.empty(20, 24, dtype=torch.bfloat16, device=DEV))
    matmul(a, b, out, split=split, partials=parts, **TILES)
    assert_close_to_reference(out, ref, torch.bfloat16)
    if split > 1:  # the partials are the slices' products, summed in order
        cdiv = lambda n, d: -(-n // d)
        k = cdiv(cdiv(150, split), 16) * 16  # slice length, a multiple of block_k
        for s in range(split):
            sl = slice(s * k, min(150, (s + 1) * k))
            torch.testing.assert_close(parts[s].double(), a[:, sl].double() @ b[sl].double(),
                                       rtol=1e-5, atol=1e-4)
        seq = torch.zeros(20, 24, device=DEV)
        for s in range(split):
            seq = seq + parts[s]
        out32 = poison_(torch.empty(20, 24, device=DEV))
        matmul(a, b, out32, split=split, partials=parts, **TILES)
        assert bitwise_equal(out32, seq)
        # bf16 output: the same ordered fp32 sum, cast in-kernel (the interpreter's
        # fp32 -> bf16 cast truncates where CUDA rounds to nearest even, so compare with
        # the kernel's own cast rather than torch's)
        assert bitwise_equal(out, ordered_sum(parts, out=torch.empty_like(out)))
    acc = randn((20, 24), torch.float32, DEV, seed=6)
    start = acc.clone()
    matmul(a, b, acc, accumulate=True, split=split, partials=parts, **TILES)
    assert_close_to_reference(acc - start, ref, torch.float32, tol=1e-5)


def test_matmul_fp32_is_exact_unless_tf32():
    a = randn((16, 64), torch.float32, DEV, seed=7)
    b = randn((64, 16), torch.float32, DEV, seed=8)
    out = torch.empty(16, 16, device=DEV)
    matmul(a, b, out, block_m=16, block_n=16, block_k=16)
    assert_close_to_reference(out, a.double() @ b.double(), torch.float32, tol=1e-6)
    matmul(a, b, out, allow_tf32=True, block_m=16, block_n=16, block_k=16)  # runs
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("prec", ["ieee", "bf16x6", "tf32x3"])
@pytest.mark.parametrize("tma", [False, True])
def test_matmul_fp32_split_precisions_near_fp32(prec, tma):
    # bf16x6 / tf32x3 split each operand into parts multiplied on tensor cores: on a GPU
    # about fp32's accuracy (the interpreter computes them in fp32)
    if tma and not tma_available():
        pytest.skip("no TMA descriptors in this Triton")
    a = randn((40, 96), torch.float32, DEV, seed=7)
    b = randn((96, 24), torch.float32, DEV, seed=8)
    out = torch.full((40, 24), float("nan"), device=DEV)
    matmul(a, b, out, fp32_precision=prec, tma=tma, block_m=16, block_n=16, block_k=32)
    assert_close_to_reference(out, a.double() @ b.double(), torch.float32, tol=2e-6)
    again = torch.full_like(out, float("nan"))
    matmul(a, b, again, fp32_precision=prec, tma=tma, block_m=16, block_n=16, block_k=32)
    assert bitwise_equal(out, again)


def test_matmul_bad_fp32_precision():
    a, b = torch.ones(4, 8, device=DEV), torch.ones(8, 4, device=DEV)
    with pytest.raises(ValueError, match="fp32_precision"):
        matmul(a, b, torch.empty(4, 4, device=DEV), fp32_precision="bf16x9")
    for m, n in ((0, 4), (4, 0)):  # refused before the empty-shape return too
        with pytest.raises(ValueError, match="fp32_precision"):
            matmul(a[:m], b[:, :n], torch.empty(m, n, device=DEV), fp32_precision="IEEE")


def test_matmul_bad_partials():
    a, b = torch.ones(4, 8, device=DEV), torch.ones(8, 4, device=DEV)
    with pytest.raises(ValueError, match="partials"):
        matmul(a, b, torch.empty(4, 4, device=DEV), split=2)
    with pytest.raises(ValueError, match="partials"):
        matmul(a, b, torch.empty(4, 4, device=DEV), split=2,
               partials=torch.empty(2, 4, 4, dtype=torch.float16, device=DEV))


def test_ordered_sum_order_and_accumulate():
    parts = randn((6, 33, 9), torch.float32, DEV, seed=9, scale=1e3)
    parts[3] *= 1e-7
    seq = torch.zeros(33, 9, device=DEV)
    for s in range(6):
        seq = seq + parts[s]
    out = poison_(torch.empty(33, 9, device=DEV))
    ordered_sum(parts, out=out, block=64)
    assert bitwise_equal(out, seq)
    half = poison_(torch.empty(33, 9, dtype=torch.float16, device=DEV))
    assert bitwise_equal(ordered_sum(parts, out=half, block=64), seq.half())
    acc = randn((33, 9), torch.float32, DEV, seed=10)
    expect = acc + seq
    ordered_sum(parts, accumulate_into=acc, block=64)
    assert bitwise_equal(acc, expect)
    rev = torch.zeros(33, 9, device=DEV)
    for s in reversed(range(6)):
        rev = rev + parts[s]
    assert not bitwise_equal(rev, seq)  # the order matters on this input


@pytest.mark.parametrize("n_parts", [1, 7, 8, 9, 17])
def test_ordered_sum_order_around_the_unroll(n_parts):
    """Part counts below, at and past the kernel's 8-part unroll keep the index order."""
    parts = randn((n_parts, 5, 7), torch.float32, DEV, seed=20 + n_parts, scale=1e3)
    parts[n_parts // 2] *= 1e-7
    seq = torch.zeros(5, 7, device=DEV)
    for s in range(n_parts):
        seq = seq + parts[s]
    out = poison_(torch.empty(5, 7, device=DEV))
    assert bitwise_equal(ordered_sum(parts, out=out, block=16), seq)
    if n_parts > 2:  # a reordered sum differs on this input: the check can fail
        rev = torch.zeros(5, 7, device=DEV)
        for s in reversed(range(n_parts)):
            rev = rev + parts[s]
        assert not bitwise_equal(rev, seq)


def test_ordered_sum_bad_arguments():
    parts = torch.zeros(2, 4, device=DEV)
    with pytest.raises(ValueError, match="exactly one"):
        ordered_sum(parts)
    with pytest.raises(ValueError, match="exactly one"):
        ordered_sum(parts, out=torch.empty(4), accumulate_into=torch.empty(4))
    with pytest.raises(ValueError, match="shape"):
        ordered_sum(parts, out=torch.empty(5, device=DEV))
    with pytest.raises(ValueError, match="fp32"):
        ordered_sum(parts, accumulate_into=torch.empty(4, dtype=torch.float16, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("H,G", [(3, 1), (2, 2), (2, 3), (1, 4)])
def test_group_sum_cast_equals_group_sum_then_cast(dtype, H, G):
    from cake_core.gemm import group_sum_cast
    from cake_core.varlen import group_sum

    x = randn((37, H * G, 40), torch.float32, DEV, seed=11 + G) * 1e3
    x[0, :, 0] = -0.0                       # a sum of negative zeros stays -0.0
    before = x.clone()
    out = group_sum_cast(x, H, dtype)
    ref = group_sum(x, H).to(dtype)
    assert out.dtype == dtype and tuple(out.shape) == (37, H, 40)
    assert bitwise_equal(out, ref)
    assert bitwise_equal(x, before)
    if G > 2:   # the order is part of the result: a reordered sum differs somewhere
        v = x.view(37, H, G, 40)
        other = (v[:, :, 0] + (v[:, :, 1] + v[:, :, 2]))
        for j in range(3, G):
            other = other + v[:, :, j]
        assert not bitwise_equal(group_sum(x, H), other)
    assert group_sum_cast(x[:0].contiguous(), H, dtype).shape == (0, H, 40)


def test_group_sum_cast_refuses_bad_input():
    from cake_core.gemm import group_sum_cast

    x = randn((5, 4, 8), torch.float32, DEV, seed=1)
    for bad, H in ((x.to(torch.bfloat16), 2), (x.transpose(0, 1), 2), (x, 3), (x[0], 2),
                   (x[:, :0].contiguous(), 1), (x, 0), (x, 8)):
        with pytest.raises(ValueError, match="group_sum_cast"):
            group_sum_cast(bad, H, torch.float32)
