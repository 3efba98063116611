"""cu_seqlens checked and read back once per tensor version (cake_core.varlen.checked_offsets),
block tables kept beside it: the same bits as without the cache, in-place edits checked
again before any launch, a bounded cache, and no second value check for the same tensor."""

import cake_causal_conv1d_det_train.api as api
import cake_core.varlen as varlen
import pytest
import torch
from cake_causal_conv1d_det_train import (
    causal_conv1d_det,
    causal_conv1d_det_bwd,
    causal_conv1d_det_fwd,
)
from cake_core.testing import (
    bitwise_equal,
    counting_offsets_cache,
    no_kernel_launches,
    offsets_cache_disabled,
    strided_cu_seqlens,
)

# empty and length-1 documents, one spanning two 32-token blocks
CU = (0, 0, 1, 5, 40, 47)


@pytest.fixture
def spy():
    """A clean cache; counts of the value checks (host read-backs) and block tables built."""
    with counting_offsets_cache(api, "_block_table") as counts:
        yield counts


def _both(conv, inp, cu):
    """Autograd entry and the low-level fwd/bwd pair; every output and gradient."""
    inp.cu = cu
    got = conv.run_cake(inp, activation="silu")
    y, fs, saved = causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, activation="silu",
                                         cu_seqlens=cu, initial_state=inp.h0,
                                         output_final_state=True)
    g = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved)
    return [got[k] for k in sorted(got)] + [y, fs, *g]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_same_bits_as_uncached(conv, spy, dtype):
    inp = conv.make_inputs(1, CU[-1], 12, 4, dtype, cu=CU, seed=5)
    cu = inp.cu
    first = _both(conv, inp, cu)
    reads, tables = spy["reads"], spy["tables"]
    assert reads == 1 and tables >= 1
    second = _both(conv, inp, cu)  # every table from the cache
    assert spy["reads"] == reads and spy["tables"] == tables
    with offsets_cache_disabled():
        plain = _both(conv, inp, cu.clone())
    assert spy["reads"] > reads
    for a, b, c in zip(first, second, plain, strict=True):
        assert bitwise_equal(a, b) and bitwise_equal(a, c)
    assert cu.tolist() == list(CU) and cu.dtype == torch.int32  # the caller's is untouched


def test_second_call_reads_nothing_back(conv, spy):
    inp = conv.make_inputs(1, CU[-1], 8, 3, cu=CU, seed=6)
    conv.run_cake(inp)
    n = dict(spy)
    for _ in range(3):
        conv.run_cake(inp)
    assert spy == n


def test_in_place_edits_checked_again(conv, spy):
    inp = conv.make_inputs(1, CU[-1], 8, 3, cu=CU, seed=7)
    cu = inp.cu
    conv.run_cake(inp)
    # a bad edit raises before any launch
    with no_kernel_launches(api, "causal_conv1d_fwd_kernel"):
        cu[2] = 9  # 9 > 5: decreasing
        with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
            conv.run_cake(inp)
        with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
            causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, cu_seqlens=cu,
                                  initial_state=inp.h0)
        cu[-1] = 46
        cu[2] = 1
        with pytest.raises(ValueError, match="cu_seqlens: must end at the token count 47"):
            conv.run_cake(inp)
    # a good edit: the new documents' results, as a fresh tensor of those values gives
    cu[-1] = 47
    cu[3] = 30
    got = conv.run_cake(inp)
    varlen.clear_offsets_cache()
    inp.cu = torch.tensor((0, 0, 1, 30, 40, 47), dtype=torch.int32, device=conv.DEV)
    want = conv.run_cake(inp)
    for k in want:
        assert bitwise_equal(got[k], want[k]), k
    ref = conv.run_reference(inp)
    assert torch.allclose(got["y"].double(), ref["y"], atol=1e-5)


def test_new_equal_tensors_and_bounded(conv, spy):
    inp = conv.make_inputs(1, CU[-1], 8, 3, cu=CU, seed=8)
    want = conv.run_cake(inp)
    n = 2 * varlen.OFFSETS_CACHE_SIZE
    for i in range(n):
        inp.cu = torch.tensor(CU, dtype=torch.int32 if i % 2 else torch.int64, device=conv.DEV)
        got = conv.run_cake(inp)
        for k in want:
            assert bitwise_equal(got[k], want[k]), k
        assert len(varlen._cache) <= varlen.OFFSETS_CACHE_SIZE
    assert spy["reads"] == n + 1


def test_compiled_in_place_edit_checked_again(conv, spy):


    torch._dynamo.reset()
    inp = conv.make_inputs(1, CU[-1], 8, 3, cu=CU, seed=9)

    def f(x, w, cu):
        return causal_conv1d_det(x, w, cu_seqlens=cu)[0]

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    cu = inp.cu
    want = f(inp.x, inp.weight, cu)
    assert torch.equal(compiled(inp.x, inp.weight, cu), want)
    assert torch.equal(compiled(inp.x, inp.weight, cu), want)
    cu[2] = 9
    with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
        compiled(inp.x, inp.weight, cu)
    cu[2] = 1
    assert torch.equal(compiled(inp.x, inp.weight, cu), want)


def _close(got, want, atol=1e-5):
    for k in want:
        if want[k] is not None:
            assert torch.allclose(got[k].double(), want[k], atol=atol, rtol=1e-5), k


@pytest.mark.parametrize("idt", [torch.int32, torch.int64])
def test_strided_cu_seqlens(conv, spy, idt):
    """A strided cu_seqlens (every other entry of a bigger tensor, with junk between) gives
    the float64 reference: the kernels read the checked offsets, never the caller's memory
    with unit stride (which read the junk and wrote out of bounds)."""
    inp = conv.make_inputs(1, CU[-1], 8, 4, cu=CU, seed=10)
    want = conv.run_reference(inp)
    inp.cu, big = strided_cu_seqlens(CU, idt, conv.DEV)
    assert not inp.cu.is_contiguous()
    for _ in range(2):  # a miss, then a hit
        _close(conv.run_cake(inp), want)
    y, fs, saved = causal_conv1d_det_fwd(inp.x, inp.weight, inp.bias, cu_seqlens=inp.cu,
                                         initial_state=inp.h0, output_final_state=True)
    g = causal_conv1d_det_bwd(inp.dy, inp.dfs, saved)
    _close(dict(y=y, fs=fs, dx=g[0], dweight=g[1], dbias=g[2], dh0=g[3]), want)
    assert big[1::2].eq(10**6).all() and big[::2].tolist() == list(CU)


def test_write_behind_torch_between_fwd_and_bwd_stays_in_bounds(conv, spy):
    """A CPU cu_seqlens written through numpy (no version bump) after the forward: the
    backward walks the offsets the forward checked (table and kernel alike), so it reads
    and writes inside the tensors (the new values reached the kernel before, with the
    forward's table: out-of-bounds offsets)."""
    if conv.DEV.type != "cpu":
        pytest.skip("a CPU tensor written through numpy")
    inp = conv.make_inputs(1, CU[-1], 8, 4, cu=CU, seed=11)
    want = conv.run_reference(inp)
    x, w, b, h0 = (t.detach().clone().requires_grad_() for t in
                   (inp.x, inp.weight, inp.bias, inp.h0))
    y, fs = causal_conv1d_det(x, w, b, cu_seqlens=inp.cu, initial_state=h0,
                              output_final_state=True)
    inp.cu.numpy()[1:-1] = 10**6  # past the end of x, no version bump
    torch.autograd.backward([y, fs], [inp.dy, inp.dfs])
    _close(dict(y=y.detach(), fs=fs.detach(), dx=x.grad, dweight=w.grad, dbias=b.grad,
                dh0=h0.grad), want)
