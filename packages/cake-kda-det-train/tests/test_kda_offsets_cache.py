"""cu_seqlens checked, read back and turned into chunk tables once per tensor version
(cake_core.varlen.resolve_chunks: one SeqChunks, kept in the offsets cache): the same bits
as without the cache, no second read-back or table build for the same unchanged tensor (the
eager entries, the low-level pair and the custom ops), in-place edits checked again before
any launch."""


import cake_core.varlen as varlen
import cake_kda_det_train.api as api
import pytest
import torch
from cake_core.testing import (
    assert_fixed_length_tables_kept,
    bitwise_equal,
    counting_offsets_cache,
    no_kernel_launches,
    offsets_cache_disabled,
    randn,
    strided_cu_seqlens,
)
from cake_core.triton_utils import default_device
from cake_kda_det_train import chunk_kda_det, chunk_kda_det_bwd, chunk_kda_det_fwd

DEV = default_device()
# an empty and a length-1 document, then one of a length not a multiple of the 16-token
# sub-chunk or the 64-token chunk (the cache's behaviour does not depend on the lengths:
# documents across sub-chunk and chunk boundaries are checked against float64 in
# test_kda_parity.py and test_kda_split_edges.py)
CU = (0, 0, 1, 9)
T, H, HV, K, V = CU[-1], 1, 1, 16, 16


@pytest.fixture
def spy():
    """A clean cache; counts of the value checks (host read-backs) and chunk tables built."""
    with counting_offsets_cache(varlen, "chunk_tables") as counts:
        yield counts


def _inputs(seed):
    q, k, v = (randn((1, T, h, d), torch.float32, DEV, seed=seed + i)
               for i, (h, d) in enumerate(((H, K), (H, K), (HV, V))))
    g = -torch.nn.functional.softplus(randn((1, T, HV, K), torch.float32, DEV, seed=seed + 3))
    beta = randn((1, T, HV), torch.float32, DEV, seed=seed + 4).sigmoid()
    h0 = 0.5 * randn((len(CU) - 1, HV, K, V), torch.float32, DEV, seed=seed + 5)
    do = randn((1, T, HV, V), torch.float32, DEV, seed=seed + 6)
    dht = randn(h0.shape, torch.float32, DEV, seed=seed + 7)
    return (q, k, v, g, beta, h0), do, dht


def _all(inp, do, dht, cu):
    """Autograd entry (fwd + bwd) and the low-level fwd/bwd pair: every output and
    gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in inp]
    o, ht = chunk_kda_det(*leaves[:5], initial_state=leaves[5],
                                       output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       cu_seqlens=cu)
    torch.autograd.backward((o, ht), (do, dht))
    o2, ht2, saved = chunk_kda_det_fwd(*inp[:5], initial_state=inp[5],
                                       output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       cu_seqlens=cu)
    g = chunk_kda_det_bwd(do, dht, saved)
    return [o, ht, *(t.grad for t in leaves), o2, ht2, *g[:6]]


def test_cached_same_bits_as_uncached(spy):
    inp, do, dht = _inputs(1)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)
    first = _all(inp, do, dht, cu)
    reads, tables = spy["reads"], spy["tables"]
    assert reads == 1 and tables == 1
    second = _all(inp, do, dht, cu)  # every offset and table from the cache
    assert spy["reads"] == reads and spy["tables"] == tables
    with offsets_cache_disabled():
        plain = _all(inp, do, dht, cu.clone())
    assert spy["reads"] > reads and spy["tables"] > tables
    for a, b, c in zip(first, second, plain, strict=True):
        assert bitwise_equal(a, b) and bitwise_equal(a, c)
    assert cu.tolist() == list(CU) and cu.dtype == torch.int32  # the caller's is untouched


def test_second_call_reads_nothing_back(spy):
    inp, do, dht = _inputs(2)
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)
    _, _, s1 = chunk_kda_det_fwd(*inp[:5], initial_state=inp[5], cu_seqlens=cu)
    chunk_kda_det_bwd(do, None, s1)
    n = dict(spy)
    assert n == {"reads": 1, "tables": 1}
    for _ in range(2):
        _, _, s2 = chunk_kda_det_fwd(*inp[:5], initial_state=inp[5], cu_seqlens=cu)
        chunk_kda_det_bwd(do, None, s2)
        # the very device tables (and saved offsets) of the first call: nothing uploaded
        assert s2.seqs is s1.seqs and s2.cu_seqlens is s1.seqs.cu
    assert spy == n


def test_in_place_edits_checked_again(spy):
    inp, do, dht = _inputs(3)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)

    def run(cu):
        return _all(inp, do, dht, cu)

    run(cu)
    # a bad edit raises before any launch
    with no_kernel_launches(api, "_launch_fwd", "_launch_bwd", "_l2norm", "kda_chunk_fwd"):
        cu[2] = 80  # 80 > 9: decreasing
        with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
            chunk_kda_det(*inp[:5], cu_seqlens=cu)
        with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
            chunk_kda_det_fwd(*inp[:5], cu_seqlens=cu)
        cu[2] = 1
        cu[-1] = 8
        with pytest.raises(ValueError, match="cu_seqlens: must end at the token count 9"):
            chunk_kda_det(*inp[:5], cu_seqlens=cu)
    # a good edit (one document fewer with tokens: fewer chunks): the new documents'
    # results, as a fresh tensor of those values gives
    cu[-1] = 9
    cu[2] = 0
    got = run(cu)
    varlen.clear_offsets_cache()
    want = run(torch.tensor((0, 0, 0, 9), dtype=torch.int32, device=DEV))
    for a, b in zip(got, want, strict=True):
        assert bitwise_equal(a, b)


def test_compiled_ops_cached_and_edits_checked(spy):
    torch._dynamo.reset()
    inp, do, _ = _inputs(4)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV)

    def f(q, k, v, g, beta, cu):
        return chunk_kda_det(q, k, v, g, beta, cu_seqlens=cu)[0]

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")

    def step(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inp[:5]]
        o = fn(*leaves, cu)
        o.backward(do)
        return [o, *(t.grad for t in leaves)]

    want = step(f)
    step(compiled)
    n = dict(spy)
    got = step(compiled)  # the fwd and bwd ops: cache hits
    assert spy == n
    for a, b in zip(got, want, strict=True):
        assert bitwise_equal(a, b)
    cu[2] = 80
    with pytest.raises(ValueError, match="cu_seqlens: must be non-decreasing"):
        compiled(*inp[:5], cu)
    cu[2] = 1
    assert bitwise_equal(compiled(*inp[:5], cu), want[0])


def test_strided_cu_seqlens(spy):
    """A strided cu_seqlens (every other entry of a bigger tensor, junk between), int32 and
    int64: the kernels read the checked offsets (a contiguous copy), never the caller's
    memory; the bits of a contiguous int32 cu_seqlens, on a miss and on a hit."""
    inp, do, dht = _inputs(5)
    want = _all(inp, do, dht, torch.tensor(CU, dtype=torch.int32, device=DEV))
    for idt in (torch.int32, torch.int64):
        cu, big = strided_cu_seqlens(CU, idt, DEV)
        assert not cu.is_contiguous()
        for _ in range(2):
            for a, b in zip(_all(inp, do, dht, cu), want, strict=True):
                assert bitwise_equal(a, b)
        assert big[1::2].eq(10**6).all() and big[::2].tolist() == list(CU)


def test_write_behind_torch_between_fwd_and_bwd(spy):
    """A CPU cu_seqlens written through numpy (no version bump) after the forward: the
    backward launches with the forward's chunk tables: the bits of an undisturbed call."""
    if DEV.type != "cpu":
        pytest.skip("a CPU tensor written through numpy")
    inp, do, dht = _inputs(6)
    want = _all(inp, do, dht, torch.tensor(CU, dtype=torch.int64, device=DEV))
    varlen.clear_offsets_cache()
    cu = torch.tensor(CU, dtype=torch.int64, device=DEV)
    leaves = [t.detach().clone().requires_grad_() for t in inp]
    o, ht = chunk_kda_det(*leaves[:5], initial_state=leaves[5],
                                       output_final_state=True, use_qk_l2norm_in_kernel=True,
                                       cu_seqlens=cu)
    _, _, saved = chunk_kda_det_fwd(*inp[:5], initial_state=inp[5], output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    cu.numpy()[1:-1] = 10**6  # past the end of the tokens, no version bump
    torch.autograd.backward((o, ht), (do, dht))
    g = chunk_kda_det_bwd(do, dht, saved)
    for a, b in zip([t.grad for t in leaves] + list(g[:6]), want[2:8] + want[10:],
                    strict=True):
        assert bitwise_equal(a, b)


def test_fixed_length_tables_kept(spy):
    """Without cu_seqlens (B rows of T tokens) the chunk tables are kept by the offsets'
    values: a second call builds and uploads nothing (no host-device sync on CUDA) and
    launches with the very device tables of the first; the same bits as after a cleared
    cache; other row lengths get their own tables."""
    inp, do, _ = _inputs(5)
    assert_fixed_length_tables_kept(chunk_kda_det_fwd, chunk_kda_det_bwd, inp[:5], do, spy)


@pytest.mark.parametrize("packed", [True, False])
def test_one_call_resolves_once_and_saves_that_object(spy, monkeypatch, packed):
    """One autograd call (forward and backward through the custom ops) resolves its
    sequences once: one read-back of cu_seqlens, one chunk-table build; the backward's saved
    set holds the very SeqChunks whose tables the forward launched with. The same for the
    low-level pair (its saved set's ``seqs``)."""
    inp, do, dht = _inputs(7)
    cu = torch.tensor(CU, dtype=torch.int32, device=DEV) if packed else None
    h0 = inp[5] if packed else None
    launched, saved_seqs = [], []
    real_fwd, real_bwd = api._launch_fwd, api._launch_bwd

    def fwd_spy(*a, **kw):
        launched.append(a[9])  # tabs: the device chunk tables
        return real_fwd(*a, **kw)

    def bwd_spy(do, dht, saved, *a, **kw):
        saved_seqs.append(saved.seqs)
        return real_bwd(do, dht, saved, *a, **kw)

    monkeypatch.setattr(api, "_launch_fwd", fwd_spy)
    monkeypatch.setattr(api, "_launch_bwd", bwd_spy)
    leaves = [t.detach().clone().requires_grad_() for t in inp[:5]]
    o, _ = chunk_kda_det(*leaves, initial_state=h0, cu_seqlens=cu)
    o.backward(do)
    assert spy == {"reads": int(packed), "tables": 1}
    (seqs,) = saved_seqs
    assert all(a is b for a, b in zip(launched[0], seqs.tables, strict=True))
    assert seqs.offsets.tolist() == (list(CU) if packed else [0, T])
    _, _, saved = chunk_kda_det_fwd(*inp[:5], initial_state=h0, cu_seqlens=cu)
    chunk_kda_det_bwd(do, None, saved)
    assert spy == {"reads": int(packed), "tables": 1}  # the same unchanged cu_seqlens
    assert saved.seqs is seqs and saved_seqs[1] is seqs and saved.cu_seqlens is seqs.cu
    assert all(a is b for a, b in zip(launched[1], seqs.tables, strict=True))
