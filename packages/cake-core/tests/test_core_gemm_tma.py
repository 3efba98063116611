"""cake_core.gemm's TMA-descriptor matmul (``matmul(..., tma=True)``, off by default) under
the interpreter: float64 reference, agreement with the pointer kernel, bitwise repeats, the
split slices and their ordered sum, the fp32 accumulate, the persistent launch, refusals."""

import pytest
import torch
from cake_core.gemm import matmul, ordered_sum, tma_layout_problem
from cake_core.testing import assert_close_to_reference, bitwise_equal, poison_, randn
from cake_core.triton_utils import default_device

DEV = default_device()
# the dense wgrad's shape: dW[N, K] = dy^T[N, M] @ x[M, K]; 200 tokens (a masked last
# token step), N = 96 and K = 80 (masked edge tiles at 64x64)
M, N, K = 200, 96, 80
TILES = dict(block_m=64, block_n=64, block_k=32, group_m=2)
DTYPES = [torch.float32, torch.bfloat16]


def _wgrad_inputs(dtype, seed=0):
    dy = randn((M, N), dtype, DEV, seed=seed + 1)
    x = randn((M, K), dtype, DEV, seed=seed + 2)
    return dy, x, dy.double().t() @ x.double()


@pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tma_wgrad_reference_pointer_and_repeat(dtype, persistent):
    dy, x, ref = _wgrad_inputs(dtype)
    out = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, out, tma=True, persistent=persistent, **TILES)
    assert_close_to_reference(out, ref, dtype, "tma dW")
    ptr = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, ptr, **TILES)
    torch.testing.assert_close(out.double(), ptr.double(), rtol=2e-2, atol=2e-2)
    again = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, again, tma=True, persistent=persistent, **TILES)
    assert bitwise_equal(out, again)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tma_plain_and_transposed_b(dtype):
    a = randn((70, 48), dtype, DEV, seed=3)
    bt = randn((40, 48), dtype, DEV, seed=4)  # b = bt.t(): column-major, transposed in-kernel
    ref = a.double() @ bt.double().t()
    out = poison_(torch.empty(70, 40, dtype=dtype, device=DEV))
    matmul(a, bt.t(), out, tma=True, block_m=32, block_n=32, block_k=16, group_m=2)
    assert_close_to_reference(out, ref, dtype)
    out2 = poison_(torch.empty(70, 40, dtype=dtype, device=DEV))
    matmul(a, bt.t().contiguous(), out2, tma=True, block_m=32, block_n=32, block_k=16,
           group_m=2)
    assert_close_to_reference(out2, ref, dtype)


@pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
@pytest.mark.parametrize("split", [2, 3])
def test_tma_split_partials_and_main_grad(split, persistent):
    dtype = torch.bfloat16
    dy, x, ref = _wgrad_inputs(dtype, seed=10)
    parts = poison_(torch.empty(split, N, K, device=DEV))
    out = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, out, split=split, partials=parts, tma=True, persistent=persistent,
           **TILES)
    assert_close_to_reference(out, ref, dtype)
    cdiv = lambda n, d: -(-n // d)  # noqa: E731
    step = cdiv(cdiv(M, split), 32) * 32  # slice length, a multiple of block_k
    for s in range(split):  # each plane is its token slice's product
        sl = slice(s * step, min(M, (s + 1) * step))
        ref_s = dy[sl].double().t() @ x[sl].double()
        torch.testing.assert_close(parts[s].double(), ref_s, rtol=1e-5, atol=1e-4)
    assert bitwise_equal(out, ordered_sum(parts, out=torch.empty_like(out)))
    # fp32 main_grad: main_grad + ordered sum of the same planes
    start = randn((N, K), torch.float32, DEV, seed=12)
    acc = start.clone()
    matmul(dy.t(), x, acc, accumulate=True, split=split, partials=parts, tma=True,
           persistent=persistent, **TILES)
    expect = start.clone()
    ordered_sum(parts, accumulate_into=expect)
    assert bitwise_equal(acc, expect)
    assert_close_to_reference(acc - start, ref, torch.float32, tol=1e-5)


@pytest.mark.parametrize("programs", [1, 3, 64])
def test_tma_persistent_bits_independent_of_program_count(programs):
    dy, x, _ = _wgrad_inputs(torch.bfloat16, seed=20)
    parts = torch.empty(2, N, K, device=DEV)
    base = torch.empty(N, K, device=DEV)
    matmul(dy.t(), x, base, split=2, partials=parts, tma=True, **TILES)
    out = poison_(torch.empty(N, K, device=DEV))
    matmul(dy.t(), x, out, split=2, partials=parts, tma=True, persistent=True,
           num_programs=programs, **TILES)
    assert bitwise_equal(out, base)


def test_tma_accumulate_split1():
    dy, x, ref = _wgrad_inputs(torch.bfloat16, seed=30)
    start = randn((N, K), torch.float32, DEV, seed=31)
    acc = start.clone()
    matmul(dy.t(), x, acc, accumulate=True, tma=True, **TILES)
    assert_close_to_reference(acc - start, ref, torch.float32, tol=1e-5)


@pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tma_scale_from_the_device(dtype, persistent):
    """``scale`` (a one-element fp32 device tensor, the LM head's upstream gradient) multiplies
    the fp32 product before the cast (16-bit out: the TMA store) and before the fp32
    accumulate; the same values as the pointer kernel's scale, and bitwise repeatable."""
    dy, x, ref = _wgrad_inputs(dtype, seed=50)
    g = torch.tensor([-0.37], dtype=torch.float32, device=DEV)
    out = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, out, tma=True, persistent=persistent, scale=g, **TILES)
    assert_close_to_reference(out, ref * -0.37, dtype)
    ptr = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, ptr, scale=g, **TILES)
    torch.testing.assert_close(out.double(), ptr.double(), rtol=2e-2, atol=2e-2)
    again = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
    matmul(dy.t(), x, again, tma=True, persistent=persistent, scale=g, **TILES)
    assert bitwise_equal(out, again)
    start = randn((N, K), torch.float32, DEV, seed=51)
    acc = start.clone()
    matmul(dy.t(), x, acc, accumulate=True, tma=True, persistent=persistent, scale=g, **TILES)
    assert_close_to_reference(acc - start, ref * -0.37, torch.float32, tol=1e-4)


def test_tma_refusals():
    a = torch.ones(32, 24, dtype=torch.bfloat16, device=DEV)
    b = torch.ones(24, 32, dtype=torch.bfloat16, device=DEV)
    out = torch.empty(32, 32, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="bias is not supported"):
        matmul(a, b, out, bias=torch.ones(32, dtype=torch.bfloat16, device=DEV), tma=True)
    with pytest.raises(ValueError, match="split == 1 only"):
        matmul(a, b, out, split=2, partials=torch.empty(2, 32, 32, device=DEV), tma=True,
               scale=torch.ones(1, device=DEV))
    with pytest.raises(ValueError, match="16 bytes"):  # 7 bf16 = 14-byte rows
        matmul(torch.ones(32, 7, dtype=torch.bfloat16, device=DEV),
               torch.ones(7, 32, dtype=torch.bfloat16, device=DEV), out, tma=True)
    with pytest.raises(ValueError, match="unit stride"):
        matmul(a[:, ::2], b[::2], out, tma=True)
    with pytest.raises(ValueError, match="aligned"):
        base = torch.ones(32 * 24 + 1, dtype=torch.bfloat16, device=DEV)
        matmul(base[1:].view(32, 24), b, out, tma=True)
    with pytest.raises(ValueError, match="<= 256"):
        matmul(a, b, out, tma=True, block_m=512)
    with pytest.raises(ValueError, match="need tma"):
        matmul(a, b, out, persistent=True)
    with pytest.raises(ValueError, match="partials"):
        matmul(a, b, out, split=2, tma=True)
    assert tma_layout_problem(a) is None and tma_layout_problem(b.t()) is None
    assert "2-D" in tma_layout_problem(a[0])
    row = torch.ones(1, 24, dtype=torch.bfloat16, device=DEV)
    assert "overlap" in tma_layout_problem(row.expand(32, 24))  # stride 0
    assert "overlap" in tma_layout_problem(row.expand(32, 24).t())
    assert tma_layout_problem(row) is None  # one row: its stride is never used
    with pytest.raises(ValueError, match="overlap"):
        matmul(row.expand(32, 24), b, out, tma=True)


@pytest.mark.parametrize("persistent", [False, True], ids=["tiles", "persistent"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_tma_store_epilogue_same_bits(dtype, persistent):
    """The TMA-store epilogue (matmul's default for a 16-bit unsplit output) writes the same
    values as the masked pointer stores, edge tiles clipped (96 x 80 at 64 x 64 tiles)."""
    dy, x, ref = _wgrad_inputs(dtype, seed=40)
    outs = []
    for store in (None, True, False):
        out = poison_(torch.empty(N, K, dtype=dtype, device=DEV))
        matmul(dy.t(), x, out, tma=True, persistent=persistent, tma_store=store, **TILES)
        outs.append(out)
    assert_close_to_reference(outs[0], ref, dtype)
    assert bitwise_equal(outs[0], outs[1]) and bitwise_equal(outs[1], outs[2])
    # a strided (column-major) output: pointer stores under the default, refused if forced
    out_t = poison_(torch.empty(K, N, dtype=dtype, device=DEV)).t()
    matmul(dy.t(), x, out_t, tma=True, persistent=persistent, **TILES)
    assert bitwise_equal(out_t.contiguous(), outs[0])
    with pytest.raises(ValueError, match="tma_store=True"):
        matmul(dy.t(), x, out_t, tma=True, tma_store=True, **TILES)


def test_tma_store_refusals():
    dy, x, _ = _wgrad_inputs(torch.bfloat16, seed=41)
    out = torch.empty(N, K, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="tma_store=True"):
        matmul(dy.t(), x, out, split=2, partials=torch.empty(2, N, K, device=DEV), tma=True,
               tma_store=True, **TILES)
    with pytest.raises(ValueError, match="tma_store=True"):
        matmul(dy.t(), x, torch.zeros(N, K, device=DEV), accumulate=True, tma=True,
               tma_store=True, **TILES)
    with pytest.raises(ValueError, match="need tma=True"):
        matmul(dy.t(), x, out, tma_store=True, **TILES)
