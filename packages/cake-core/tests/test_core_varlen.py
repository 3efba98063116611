"""cake_core.varlen: sequence offsets, chunk tables, the chunk bound, the value-head sum, the
offsets cache and the resolved sequences of a chunked call (resolve_chunks)."""

import itertools

import pytest
import torch
from cake_core.testing import assert_imports_without_triton, bitwise_equal
from cake_core.varlen import chunk_tables, group_sum, max_chunks, seq_offsets


def test_import_does_not_import_triton():
    assert_imports_without_triton("cake_core.varlen")


def test_seq_offsets():
    cu = seq_offsets(None, 3, 5)
    assert cu.dtype == torch.int64 and cu.device.type == "cpu" and cu.tolist() == [0, 5, 10, 15]
    assert seq_offsets(None, 2, 0).tolist() == [0, 0, 0]
    given = torch.tensor([0, 0, 1, 7], dtype=torch.int32)
    cu = seq_offsets(given, 1, 7)
    assert cu.dtype == torch.int64 and cu.device.type == "cpu" and cu.tolist() == [0, 0, 1, 7]
    assert given.dtype == torch.int32  # the argument is not modified


def _chunks_by_loop(cu: list[int], c: int):
    starts, ends, off = [], [], [0]
    for bos, eos in itertools.pairwise(cu):
        for s in range(bos, eos, c):
            starts.append(s)
            ends.append(min(s + c, eos))
        off.append(len(starts))
    return starts, ends, off


@pytest.mark.parametrize("cu,chunk", [
    ([0, 0, 1, 65, 129, 129, 200], 64),  # empty, length-1, 64, 64, empty, 71 tokens
    ([0, 1], 64),                        # one length-1 sequence
    ([0, 0], 64),                        # one empty sequence: no chunk
    ([0, 0, 0, 0], 16),                  # only empty sequences
    ([0, 17, 34, 35, 51], 16),           # lengths 17, 17, 1, 16
    ([0, 5, 6, 13], 1),                  # chunk of one token
    ([0, 300], 128),
])
def test_chunk_tables_match_a_loop(cu, chunk):
    starts, ends, off, nc = chunk_tables(torch.tensor(cu, dtype=torch.int64), chunk)
    want_s, want_e, want_off = _chunks_by_loop(cu, chunk)
    assert isinstance(nc, int) and nc == len(want_s)
    for t in (starts, ends, off):
        assert t.dtype == torch.int32 and t.device.type == "cpu"
    assert starts.tolist() == want_s and ends.tolist() == want_e and off.tolist() == want_off
    assert tuple(starts.shape) == tuple(ends.shape) == (nc,) and off.numel() == len(cu)
    assert nc <= max_chunks(cu[-1], len(cu) - 1, chunk)


@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
def test_max_chunks_is_the_tight_bound(chunk):
    """For every split of n tokens into s sequences the chunk count is <= max_chunks, and
    some split reaches it."""
    for n in range(0, 13):
        for s in range(1, 5):
            best = 0
            for cuts in itertools.combinations_with_replacement(range(n + 1), s - 1):
                cu = [0, *cuts, n]
                best = max(best, sum(-(-(b - a) // chunk) for a, b in itertools.pairwise(cu)))
            assert max_chunks(n, s, chunk) == best, (n, s, chunk)
    assert max_chunks(200, 5, 64) == 8 and max_chunks(65, 2, 64) == 2


def test_group_sum_heads_and_order():
    NT, H, G, K = 3, 2, 4, 5
    # head h gets value heads h*G .. h*G+G-1 (consecutive), exact in fp32
    x = torch.arange(NT * H * G * K, dtype=torch.float32).view(NT, H * G, K)
    want = x.view(NT, H, G, K).sum(2)
    assert torch.equal(group_sum(x, H), want)
    # values where float order matters: left to right gives ((1e8 + 1) - 1e8) + 1 = 1
    vals = torch.tensor([1e8, 1.0, -1e8, 1.0], dtype=torch.float32)
    x = vals.view(1, 4, 1).expand(NT, 4, K).contiguous()
    out = group_sum(x, 1)
    assert tuple(out.shape) == (NT, 1, K) and out.dtype == torch.float32
    assert bool((out == 1.0).all())
    ordered = x[:, 0:1].clone()
    for j in range(1, 4):
        ordered = ordered + x[:, j:j + 1]
    assert bitwise_equal(out, ordered)
    # another order gives other bits on this input: the order is what the sum fixes
    other = ((x[:, 0:1] + x[:, 2:3]) + x[:, 1:2]) + x[:, 3:4]
    assert not torch.equal(out, other)


def test_group_sum_identity_and_input_untouched():
    x = torch.randn(4, 3, 8, generator=torch.Generator().manual_seed(0))
    assert group_sum(x, 3) is x
    y = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))
    before = y.clone()
    out = group_sum(y, 3)
    assert bitwise_equal(y, before) and tuple(out.shape) == (4, 3, 8)
    assert bitwise_equal(out, y[:, 0::2] + y[:, 1::2])


# ----------------------------------------------------------------------------- checked_offsets

@pytest.fixture
def offsets_cache(monkeypatch):
    """A clean cache, and a count of the value checks (host read-backs) that run."""
    import cake_core.varlen as varlen

    varlen.clear_offsets_cache()
    reads = []
    real = varlen.check_cu_seqlens

    def spy(*args, **kw):
        if kw.get("read_values", True):
            reads.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(varlen, "check_cu_seqlens", spy)
    yield varlen, reads
    varlen.clear_offsets_cache()


def test_checked_offsets_validates_once_per_version(offsets_cache):
    varlen, reads = offsets_cache
    cu = torch.tensor([0, 0, 1, 7], dtype=torch.int32)
    a = varlen.checked_offsets(cu, 7)
    assert a.dtype == torch.int64 and a.device.type == "cpu" and a.tolist() == [0, 0, 1, 7]
    assert len(reads) == 1
    b = varlen.checked_offsets(cu, 7)
    assert b is a and len(reads) == 1  # same tensor, unchanged: no second read
    # another token count is another key: checked (and refused) again
    with pytest.raises(ValueError, match="cu_seqlens: must end at the token count 8"):
        varlen.checked_offsets(cu, 8)
    # the checks that read no values run on every call, hit or not
    with pytest.raises(ValueError, match="cu_seqlens: on cpu, inputs on meta"):
        varlen.checked_offsets(cu, 7, torch.device("meta"))
    assert cu.tolist() == [0, 0, 1, 7] and cu.dtype == torch.int32


def test_checked_offsets_in_place_edits_are_checked_again(offsets_cache):
    varlen, reads = offsets_cache
    cu = torch.tensor([0, 3, 5, 9], dtype=torch.int64)
    first = varlen.checked_offsets(cu, 9)
    assert first.data_ptr() != cu.data_ptr()  # never the caller's memory
    cu[1] = 6  # bad: 6 > 5
    with pytest.raises(ValueError, match="non-decreasing"):
        varlen.checked_offsets(cu, 9)
    cu[1] = 4  # good again
    assert varlen.checked_offsets(cu, 9).tolist() == [0, 4, 5, 9]
    assert first.tolist() == [0, 3, 5, 9]  # what was returned before is not rewritten
    cu[1:2].fill_(2)  # through a view: the version counter is shared
    assert varlen.checked_offsets(cu, 9).tolist() == [0, 2, 5, 9]
    # a CPU write that torch does not see (no version bump) is caught by the value compare
    n = len(reads)
    cu.numpy()[1] = 7
    with pytest.raises(ValueError, match="non-decreasing"):
        varlen.checked_offsets(cu, 9)
    assert len(reads) == n + 1


def test_checked_offsets_equal_tensors_and_bounded(offsets_cache):
    varlen, reads = offsets_cache
    n = 3 * varlen.OFFSETS_CACHE_SIZE
    tensors = [torch.tensor([0, 2, 5], dtype=torch.int32) for _ in range(n)]
    for t in tensors:
        assert varlen.checked_offsets(t, 5).tolist() == [0, 2, 5]
    assert len(reads) == len(tensors)  # equal values, other tensors: each checked once
    assert len(varlen._cache) == varlen.OFFSETS_CACHE_SIZE
    # the newest are kept, the oldest pushed out (checked again)
    varlen.checked_offsets(tensors[-1], 5)
    assert len(reads) == len(tensors)
    varlen.checked_offsets(tensors[0], 5)
    assert len(reads) == len(tensors) + 1
    varlen.clear_offsets_cache()
    assert len(varlen._cache) == 0


def test_checked_offsets_not_cached(offsets_cache):
    varlen, reads = offsets_cache
    with torch.inference_mode():
        cu = torch.tensor([0, 1, 4])
    for _ in range(2):  # inference tensors have no version counter: checked every call
        assert varlen.checked_offsets(cu, 4).tolist() == [0, 1, 4]
    assert len(reads) == 2 and len(varlen._cache) == 0
    with pytest.raises(ValueError, match="cu_seqlens: expected a torch.Tensor"):
        varlen.checked_offsets([0, 4], 4)
    with pytest.raises(ValueError, match="lens: must start at 0"):
        varlen.checked_offsets(torch.tensor([1, 4]), 4, name="lens")
    assert len(varlen._cache) == 0  # nothing bad is remembered


def test_offsets_derived(offsets_cache):
    varlen, _ = offsets_cache
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    builds = []

    def build():
        builds.append(1)
        return object()

    off = varlen.checked_offsets(cu, 5)
    a = varlen.offsets_derived(cu, off, "k", build)
    assert varlen.offsets_derived(cu, off, "k", build) is a and len(builds) == 1
    assert varlen.offsets_derived(cu, off, "other", build) is not a and len(builds) == 2
    # offsets that are not the cache's (e.g. saved before an edit) are never served
    assert varlen.offsets_derived(cu, off.clone(), "k", build) is not a and len(builds) == 3
    cu.add_(0)  # a new version: the derived values of the old one are not served
    assert varlen.offsets_derived(cu, off, "k", build) is not a and len(builds) == 4
    off2 = varlen.checked_offsets(cu, 5)
    b = varlen.offsets_derived(cu, off2, "k", build)
    assert b is not a and varlen.offsets_derived(cu, off2, "k", build) is b
    assert varlen.offsets_derived(None, off2, "k", build) is not b


# ----------------------------------------------------------------------------- resolve_chunks

CPU = torch.device("cpu")


def test_resolve_chunks_once_per_version(offsets_cache, monkeypatch):
    """One SeqChunks per cu_seqlens version: read back and built once, the same object for
    the tensor and for its own device offsets (what a saved set keeps); the tables are
    chunk_tables' and the offsets', in one upload; an edit is resolved again."""
    varlen, reads = offsets_cache
    built = []
    real = varlen.chunk_tables
    monkeypatch.setattr(varlen, "chunk_tables", lambda *a: built.append(a[1]) or real(*a))
    cu = torch.tensor([0, 0, 1, 70, 75], dtype=torch.int32)
    seqs = varlen.resolve_chunks(cu, 1, 75, CPU, 64)
    starts, ends, chunk_off, nc = real(seqs.offsets, 64)
    assert seqs.num_chunks == nc == 4 and seqs.num_seqs == 4 and seqs.chunk_size == 64
    assert [t.tolist() for t in seqs.tables[:3]] == [t.tolist() for t in (starts, ends,
                                                                            chunk_off)]
    assert [t.dtype for t in seqs.tables[:4]] == [torch.int32] * 3 + [torch.int64]
    assert seqs.cu.tolist() == [0, 0, 1, 70, 75] and seqs.tables[4] == 4
    assert varlen.resolve_chunks(cu, 1, 75, CPU, 64) is seqs
    assert varlen.resolve_chunks(seqs.cu, 1, 75, CPU, 64) is seqs  # a saved cu_seqlens
    assert varlen.checked_offsets(cu, 75) is seqs.offsets
    assert len(reads) == 1 and built == [64]
    other = varlen.resolve_chunks(cu, 1, 75, CPU, 32)  # another chunk size: its own
    assert other.num_chunks == 5 and built == [64, 32] and len(reads) == 1
    assert seqs.tables_on(CPU) is not None and seqs.tables_on(CPU)[0] is seqs.starts
    cu[3] = 64
    again = varlen.resolve_chunks(cu, 1, 75, CPU, 64)
    assert again is not seqs and again.offsets.tolist() == [0, 0, 1, 64, 75]
    assert len(reads) == 2 and seqs.offsets.tolist() == [0, 0, 1, 70, 75]
    with pytest.raises(ValueError, match="cu_seqlens: must end at the token count 76"):
        varlen.resolve_chunks(cu, 1, 76, CPU, 64)


def test_resolve_chunks_rows_kept_and_bounded(offsets_cache, monkeypatch):
    """Without cu_seqlens (B rows of T tokens): kept per (B, T) in the same cache (at most
    OFFSETS_CACHE_SIZE entries, least recently used out), also with no chunk at all."""
    varlen, reads = offsets_cache
    rows = varlen.resolve_chunks(None, 2, 70, CPU, 64)
    assert rows.offsets.tolist() == [0, 70, 140] and rows.num_chunks == 4
    assert [t.tolist() for t in rows.tables[:3]] == [[0, 64, 70, 134], [64, 70, 134, 140],
                                                    [0, 2, 4]]
    assert varlen.resolve_chunks(None, 2, 70, CPU, 64) is rows
    assert varlen.resolve_chunks(rows.cu, 2, 70, CPU, 64) is rows
    assert reads == []
    for n in range(varlen.OFFSETS_CACHE_SIZE + 3):
        varlen.resolve_chunks(None, 3, n + 1, CPU, 4)
    assert len(varlen._cache) == varlen.OFFSETS_CACHE_SIZE
    empty = varlen.resolve_chunks(None, 2, 0, CPU, 4)
    assert empty.num_chunks == 0 and [t.numel() for t in empty.tables[:4]] == [0, 0, 3, 3]


def test_offsets_cache_pins_what_a_captured_graph_reads(offsets_cache, monkeypatch):
    """While a CUDA graph is captured, the tables a call takes from the cache (rows or a
    cu_seqlens) are served as in eager calls and pinned: never pushed out by later calls, so
    a replay never reads memory the cache let go. Tables first built during the capture are
    kept (pinned) as well."""
    varlen, _ = offsets_cache
    rows = varlen.resolve_chunks(None, 2, 9, CPU, 4)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    packed = varlen.resolve_chunks(cu, 1, 10, CPU, 4)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert varlen.resolve_chunks(None, 2, 9, CPU, 4) is rows
    assert varlen.resolve_chunks(cu, 1, 10, CPU, 4) is packed
    new_rows = varlen.resolve_chunks(None, 2, 18, CPU, 4)  # built during the capture
    monkeypatch.undo()
    for n in range(3 * varlen.OFFSETS_CACHE_SIZE):
        varlen.resolve_chunks(None, 3, n + 1, CPU, 4)
    assert varlen.resolve_chunks(None, 2, 9, CPU, 4) is rows
    assert varlen.resolve_chunks(cu, 1, 10, CPU, 4) is packed
    assert varlen.resolve_chunks(None, 2, 18, CPU, 4) is new_rows
    assert len(varlen._cache) <= varlen.OFFSETS_CACHE_SIZE + 4  # the pinned ones on top
    varlen.clear_offsets_cache()
    assert varlen.resolve_chunks(None, 2, 9, CPU, 4) is not rows


def test_tables_copied_to_another_stream_while_captured_are_kept(offsets_cache, monkeypatch):
    """A backward on another stream than its forward's copies the tables there
    (SeqChunks.tables_on). Eagerly that copy is kept by nothing; while a CUDA graph is
    captured it is kept in the cache, pinned, with the pinned host block of its captured
    upload: the graph reads both at every replay."""
    varlen, _ = offsets_cache
    rows = varlen.resolve_chunks(None, 2, 9, CPU, 4)
    monkeypatch.setattr(varlen, "_stream_of", lambda device: 7)  # not the forward's stream
    eager = rows.tables_on(CPU)
    assert eager[0] is not rows.starts
    assert [t.tolist() for t in eager[:4]] == [t.tolist() for t in rows.tables[:4]]
    n = len(varlen._cache)
    monkeypatch.setattr(varlen, "_capturing", lambda: True)
    captured = rows.tables_on(CPU)
    assert captured[0] is not rows.starts and len(varlen._cache) == n + 1
    monkeypatch.setattr(varlen, "_capturing", lambda: False)
    for i in range(3 * varlen.OFFSETS_CACHE_SIZE):  # never pushed out
        varlen.resolve_chunks(None, 3, i + 1, CPU, 4)
    kept = varlen.resolve_chunks(captured[3], 2, 9, CPU, 4)  # found by its device offsets
    assert kept.tables == captured
