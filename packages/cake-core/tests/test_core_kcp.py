"""cake_core.kcp: partitions (layouts, explicit tables), contexts, exchange and halo plans.

Every plan is checked against a token-level brute force: who holds each global token at
which local position, and what the chain, the state folds and the halo rows must be.
"""

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from cake_core.kcp import (
    AllGatherPlan,
    Fragment,
    Partition,
    RingPlan,
    agree_once,
    build_context,
    build_context_det_kcp,
    has_middle_fragments,
    partition_det_kcp,
)
from cake_core.kcp import check_context as check_entry_context

# ---------------------------------------------------------------- cases

CU_CASES = [
    [0, 0],                      # one empty document, T = 0
    [0, 1],                      # T = 1 (< W for W >= 2)
    [0, 3],                      # T < 2W for most W
    [0, 0, 1, 1, 2],             # empty and length-1 documents
    [0, 17],                     # one document spanning every rank
    [0, 5, 5, 12, 13, 29],       # mixed, an empty document in the middle
    [0, 1, 2, 3, 4, 5, 6, 7],    # seven length-1 documents
    [0, 64, 128, 192, 256],      # T divisible by every W, docs of 64
    [0, 100, 101, 103, 250],     # T not divisible by 3, 4
    [0, 2, 40, 41, 41, 41, 97],  # trailing empty documents and a long one
]
LAYOUTS = ["contiguous", "zigzag", "zigzag_per_document"]
WORLDS = [1, 2, 3, 4, 5]


def _ranges(cu, w, layout):
    """The spec's global token ranges per rank, in local order."""
    t = cu[-1]
    if layout == "contiguous":
        return [[(r * t // w, (r + 1) * t // w)] for r in range(w)]
    if layout == "zigzag_per_document":
        out = [[] for _ in range(w)]
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            cut = [a + p * (b - a) // (2 * w) for p in range(2 * w + 1)]
            for r in range(w):
                out[r] += [(cut[r], cut[r + 1]), (cut[2 * w - 1 - r], cut[2 * w - r])]
        return out
    cut = [p * t // (2 * w) for p in range(2 * w + 1)]
    return [[(cut[r], cut[r + 1]), (cut[2 * w - 1 - r], cut[2 * w - r])] for r in range(w)]


def _owners(p):
    """global token -> (rank, local position), from global_index."""
    own = {}
    for r in range(p.world_size):
        for j, g in enumerate(p.global_index(r).tolist()):
            assert g not in own, f"token {g} held twice"
            own[g] = (r, j)
    return own


def _doc_of(cu, g):
    return max(d for d in range(len(cu) - 1) if cu[d] <= g < cu[d + 1])


def _runs(cu, own, doc):
    """Brute-force chain: the doc's tokens in order, grouped into runs held by one rank at
    consecutive local positions -> [(rank, first local position, length)]."""
    runs = []
    for g in range(cu[doc], cu[doc + 1]):
        r, j = own[g]
        if runs and runs[-1][0] == r and runs[-1][1] + runs[-1][2] == j:
            runs[-1][2] += 1
        else:
            runs.append([r, j, 1])
    return [tuple(x) for x in runs]


def check_partition(p, cu):
    """Every invariant of a partition, against brute force."""
    w, t = p.world_size, cu[-1]
    assert p.total_tokens == t and p.num_docs == len(cu) - 1 and list(p.cu_seqlens) == cu
    assert p.cu_seqlens_cpu().tolist() == cu
    own = _owners(p)
    assert sorted(own) == list(range(t)), "every token exactly once"
    for r in range(w):
        frags = p.fragments(r)
        off = 0
        for i, f in enumerate(frags):
            assert isinstance(f, Fragment) and f.rank == r
            assert f.length >= 1 and f.local_offset == off
            assert f.global_offset == cu[f.doc] + f.doc_offset
            assert f.doc_offset + f.length <= cu[f.doc + 1] - cu[f.doc]
            idx = p.global_index(r)[f.local_offset:f.local_offset + f.length].tolist()
            assert idx == list(range(f.global_offset, f.global_offset + f.length))
            assert p.doc_chain(f.doc)[f.chain_pos] == (r, i)
            assert (f.prev_rank is None) == (f.doc_offset == 0) == (not f.has_prev)
            ends = f.doc_offset + f.length == cu[f.doc + 1] - cu[f.doc]
            assert (f.next_rank is None) == ends == (not f.has_next)
            if i:  # maximal: never continues the previous local fragment
                q = frags[i - 1]
                assert not (q.doc == f.doc and q.doc_offset + q.length == f.doc_offset)
            off += f.length
        assert p.local_num_tokens(r) == off
        lcu = p.local_cu_seqlens(r)
        assert lcu.dtype == torch.int64 and lcu.device.type == "cpu"
        assert lcu.tolist() == [0] + [f.local_offset + f.length for f in frags]
    for d in range(p.num_docs):
        chain = p.doc_chain(d)
        runs = _runs(cu, own, d)
        assert len(chain) == len(runs)
        doc_off = 0
        for pos, ((r, i), (rr, j, n)) in enumerate(zip(chain, runs, strict=True)):
            f = p.fragments(r)[i]
            assert (r, f.local_offset, f.length) == (rr, j, n)
            assert f.doc == d and f.chain_pos == pos and f.doc_offset == doc_off
            assert f.prev_rank == (chain[pos - 1][0] if pos else None)
            assert f.next_rank == (chain[pos + 1][0] if pos + 1 < len(chain) else None)
            doc_off += n
        assert doc_off == cu[d + 1] - cu[d]


# ---------------------------------------------------------------- layouts


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("w", WORLDS)
@pytest.mark.parametrize("cu", CU_CASES)
def test_layouts_tile_documents(cu, w, layout):
    p = Partition.from_cu_seqlens(torch.tensor(cu, dtype=torch.int64), w, layout)
    assert p.world_size == w and p.layout == layout
    check_partition(p, cu)
    # local order is the spec's: the rank's ranges concatenated
    for r, rr in enumerate(_ranges(cu, w, layout)):
        want = [g for a, b in rr for g in range(a, b)]
        assert p.global_index(r).tolist() == want
    # same partition from int32, a list and a tuple
    assert p == Partition.from_cu_seqlens(torch.tensor(cu, dtype=torch.int32), w, layout)
    assert p == Partition.from_cu_seqlens(tuple(cu), w, layout)
    # and from the same ranges given explicitly
    rr = [[(a, b - a) for a, b in x] for x in _ranges(cu, w, layout)]
    q = Partition.from_ranges(cu, w, rr)
    assert q == p and hash(q) == hash(p) and q.key == p.key and q.layout == "ranges"


def test_examples_by_hand():
    # T = 10, W = 3 contiguous: cuts 0, 3, 6, 10; docs [0, 4), [4, 10)
    p = Partition.from_cu_seqlens([0, 4, 10], 3)
    f0, = p.fragments(0)[:1]
    assert (f0.doc, f0.doc_offset, f0.length, f0.next_rank) == (0, 0, 3, 1)
    assert [(f.doc, f.doc_offset, f.length) for f in p.fragments(1)] == [(0, 3, 1), (1, 0, 2)]
    assert [(f.doc, f.doc_offset, f.length) for f in p.fragments(2)] == [(1, 2, 4)]
    assert p.doc_chain(0) == ((0, 0), (1, 0)) and p.doc_chain(1) == ((1, 1), (2, 0))
    # zigzag: one document over W = 2 visits ranks 0, 1, 0 (parts 1 and 2 merge on rank 1)
    z = Partition.from_cu_seqlens([0, 8], 2, "zigzag")
    assert p.local_cu_seqlens(1).tolist() == [0, 1, 3]
    assert z.doc_chain(0) == ((0, 0), (1, 0), (0, 1))
    assert [(f.doc_offset, f.length, f.prev_rank, f.next_rank) for f in z.fragments(0)] == \
        [(0, 2, None, 1), (6, 2, 1, None)]
    assert z.global_index(0).tolist() == [0, 1, 6, 7]
    # zigzag W = 3, one doc of 12: chain 0, 1, 2, 1, 0 (parts 2 and 3 merge on rank 2)
    z3 = Partition.from_cu_seqlens([0, 12], 3, "zigzag")
    assert [r for r, _ in z3.doc_chain(0)] == [0, 1, 2, 1, 0]
    # W = 1: zigzag equals contiguous (the two halves merge)
    assert Partition.from_cu_seqlens([0, 5, 9], 1, "zigzag") == \
        Partition.from_cu_seqlens([0, 5, 9], 1)


def test_empty_ranks_and_docs():
    p = Partition.from_cu_seqlens([0, 0, 1, 1, 2], 4)  # T = 2 < W = 4
    assert [p.local_num_tokens(r) for r in range(4)] == [0, 1, 0, 1]
    assert p.fragments(0) == () and p.local_cu_seqlens(0).tolist() == [0]
    assert p.global_index(0).tolist() == []
    assert p.doc_chain(0) == () and p.doc_chain(2) == ()
    z = Partition.from_cu_seqlens([0, 0], 3, "zigzag")
    assert all(z.fragments(r) == () for r in range(3)) and z.total_tokens == 0


# ---------------------------------------------------------------- explicit tables


def test_explicit_fragment_table():
    cu = [0, 6, 6, 10]
    table = [  # rank 1 holds doc 2 then doc 0's middle; rank 0 the rest
        (0, 0, 0, 2), (1, 2, 0, 4), (1, 0, 2, 3), (0, 0, 5, 1),
        (2, 1, 0, 0),  # zero-length: dropped
    ]
    p = Partition.from_fragments(table, 3, 10, cu_seqlens=cu)
    check_partition(p, cu)
    assert p.layout == "explicit" and p.fragments(2) == ()
    assert [(f.doc, f.doc_offset, f.length) for f in p.fragments(1)] == [(2, 0, 4), (0, 2, 3)]
    assert p.doc_chain(0) == ((0, 0), (1, 1), (0, 1))
    # without cu_seqlens the documents come from the rows (the zero-length row declares
    # the empty document 1)
    assert Partition.from_fragments(table, 3, 10) == p
    # mappings and Fragment objects are rows too; a rank's continuing rows merge
    rows = [dict(rank=0, doc=0, doc_offset=0, length=1), dict(rank=0, doc=0, doc_offset=1,
            length=1)] + [f for r in range(3) for f in p.fragments(r) if f.rank == 1] + \
        [(0, 0, 5, 1)]
    q = Partition.from_fragments(rows, 3, 10, cu_seqlens=cu)
    assert q == p


def test_explicit_table_equals_layout():
    cu = [0, 5, 5, 12, 13, 29]
    for layout in LAYOUTS:
        p = Partition.from_cu_seqlens(cu, 4, layout)
        per_rank = [[(f.rank, f.doc, f.doc_offset, f.length) for f in p.fragments(r)]
                    for r in range(4)]
        # ranks interleaved round-robin; each rank's relative order (its local order) kept
        rows = [x[k] for k in range(max(map(len, per_rank))) for x in per_rank if k < len(x)]
        q = Partition.from_fragments(rows, 4, 29, cu_seqlens=cu)
        assert q == p and q.key == p.key


def test_many_small_fragments_random_tables():
    rng = random.Random(7)
    for _ in range(60):
        n_docs = rng.randint(1, 5)
        lens = [rng.choice([0, 1, 2, 3, 7]) for _ in range(n_docs)]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        w = rng.randint(1, 5)
        pieces = []
        for d, n in enumerate(lens):
            off = 0
            while off < n:
                k = rng.randint(1, n - off)
                pieces.append((rng.randrange(w), d, off, k))
                off += k
        rng.shuffle(pieces)
        p = Partition.from_fragments(pieces, w, cu[-1], cu_seqlens=cu)
        check_partition(p, cu)
        for conv in (1, 2, 4, 6):
            for r in range(w):
                check_context(p, r, conv)


# ---------------------------------------------------------------- serialisation


@pytest.mark.parametrize("layout", LAYOUTS)
def test_serialisation_round_trip_and_hash(layout):
    p = Partition.from_cu_seqlens([0, 5, 5, 12, 13, 29], 3, layout)
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d
    q = Partition.from_dict(json.loads(p.to_json()))
    assert q == p and hash(q) == hash(p) and q.key == p.key and q.layout == layout
    assert {p: 1}[q] == 1
    r = pickle.loads(pickle.dumps(p))
    assert r == p and hash(r) == hash(p) and r.doc_chain(3) == p.doc_chain(3)
    assert p.key.startswith("Partition:") and len(p.key) == len("Partition:") + 16
    other = Partition.from_cu_seqlens([0, 5, 5, 12, 13, 29], 4, layout)
    assert other != p and other.key != p.key


def test_hash_and_key_same_in_another_process():
    # hash() comes from the sha256 key, not from Python's randomised string hashing
    ps = [Partition.from_cu_seqlens([0, 5, 5, 12, 13, 29], 3, lay) for lay in LAYOUTS]
    code = ("import json,sys; from cake_core.kcp import Partition; "
            "[print(hash(p), p.key) for p in map(Partition.from_dict, json.loads(sys.argv[1]))]")
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x), PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([p.to_dict() for p in ps])],
                         capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == [x for p in ps for x in (str(hash(p)), p.key)]


def test_from_dict_rejects():
    d = Partition.from_cu_seqlens([0, 4], 2).to_dict()
    for bad, msg in [({**d, "kind": "x"}, "kind"), ({**d, "format_version": 9}, "format"),
                     ({k: v for k, v in d.items() if k != "fragments"}, "missing key"),
                     ({**d, "fragments": [[0, 0, 0, 2]]}, "do not cover")]:
        with pytest.raises(ValueError, match=msg):
            Partition.from_dict(bad)
    with pytest.raises(ValueError, match="^d:"):
        Partition.from_dict([1, 2])


def test_import_does_not_import_triton():
    code = ("import sys, cake_core.kcp; "
            "assert 'triton' not in sys.modules, 'triton imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": ":".join(p for p in sys.path if p)})
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("cu,msg", [
    ([1, 4], "must start at 0"),
    ([0, 4, 3], "non-decreasing"),
    ([0], "at least 2"),
    ([0, 2.0], "integer"),
    ([0, True], "integer"),
    (torch.tensor([0.0, 4.0]), "dtype"),
    (torch.tensor([[0, 4]]), "1-D"),
    ("0,4", "expected a CPU int tensor"),
])
def test_bad_cu_seqlens(cu, msg):
    with pytest.raises(ValueError, match=f"^cu_seqlens_global_cpu.*{msg}"):
        Partition.from_cu_seqlens(cu, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA tensor")
def test_cu_seqlens_on_device_rejected():
    with pytest.raises(ValueError, match="CPU"):
        Partition.from_cu_seqlens(torch.tensor([0, 4], device="cuda"), 2)


def test_bad_world_layout():
    for w in (0, -1, 1.0, True):
        with pytest.raises(ValueError, match="^world_size"):
            Partition.from_cu_seqlens([0, 4], w)
    with pytest.raises(ValueError, match="^layout"):
        Partition.from_cu_seqlens([0, 4], 2, "ring")
    p = Partition.from_cu_seqlens([0, 4], 2)
    for bad in (2, -1, "0"):
        with pytest.raises(ValueError, match="^rank"):
            p.fragments(bad)
    with pytest.raises(ValueError, match="^doc"):
        p.doc_chain(1)
    with pytest.raises(ValueError, match="^index"):
        p.fragment(0, 5)


def test_bad_tables():
    cu = [0, 4, 6]
    cases = [
        ([(0, 0, 0, 4), (1, 1, 0, 2), (1, 0, 3, 1)], "overlap"),
        ([(0, 0, 0, 3), (1, 1, 0, 2)], "do not cover document 0 tokens \\[3, 4\\)"),
        ([(0, 0, 1, 3), (1, 1, 0, 2)], "do not cover document 0 tokens \\[0, 1\\)"),
        ([(0, 0, 0, 5), (1, 1, 0, 2)], "past the document's length"),
        ([(2, 0, 0, 4), (1, 1, 0, 2)], "rank 2 is not in"),
        ([(0, 0, 0, 4), (1, 2, 0, 2)], "doc 2 is not in"),
        ([(0, 0, -1, 4)], ">= 0"),
        ([(0, 0, 0)], "expected \\(rank, doc, doc_offset, length\\)"),
        ([{"rank": 0, "doc": 0, "length": 4}], "missing key 'doc_offset'"),
        ([(0, 0, 0, 4.0)], "integer"),
    ]
    for table, msg in cases:
        with pytest.raises(ValueError, match=msg):
            Partition.from_fragments(table, 2, 6, cu_seqlens=cu)
    with pytest.raises(ValueError, match="^cu_seqlens: ends at 6, but total_tokens is 7"):
        Partition.from_fragments([(0, 0, 0, 4), (1, 1, 0, 2)], 2, 7, cu_seqlens=cu)
    # without cu_seqlens: coverage is checked against total_tokens
    with pytest.raises(ValueError, match="span 6 tokens, but total_tokens is 8"):
        Partition.from_fragments([(0, 0, 0, 4), (1, 1, 0, 2)], 2, 8)
    with pytest.raises(ValueError, match="overlap"):
        Partition.from_fragments([(0, 0, 0, 4), (1, 0, 2, 2)], 2, 4)
    with pytest.raises(ValueError, match="^total_tokens"):
        Partition.from_fragments([], 2, -1)
    with pytest.raises(ValueError, match="^table"):
        Partition.from_fragments("abc", 2, 0)
    with pytest.raises(ValueError, match="^world_size"):
        Partition.from_fragments([], 0, 0)


def test_bad_ranges():
    cu = [0, 4, 6]
    with pytest.raises(ValueError, match="^ranges: expected a sequence of world_size = 2"):
        Partition.from_ranges(cu, 2, [[(0, 6)]])
    with pytest.raises(ValueError, match="not inside"):
        Partition.from_ranges(cu, 2, [[(0, 4)], [(4, 3)]])
    with pytest.raises(ValueError, match="overlap"):
        Partition.from_ranges(cu, 2, [[(0, 4)], [(3, 3)]])
    with pytest.raises(ValueError, match="do not cover"):
        Partition.from_ranges(cu, 2, [[(0, 3)], [(4, 2)]])
    with pytest.raises(ValueError, match="global_start, length"):
        Partition.from_ranges(cu, 2, [[(0, 4, 1)], [(4, 2)]])


# ---------------------------------------------------------------- contexts


def check_context(p, rank, conv, exchange="allgather"):
    """A context (built unchecked for any rank) against the partition and brute force."""
    ctx = build_context(p, None, rank, "cpu", conv, exchange=exchange, check_group=False)
    frags = p.fragments(rank)
    assert ctx.fragments == frags and ctx.num_tokens == p.local_num_tokens(rank)
    assert ctx.cu_seqlens.tolist() == ctx.cu_seqlens_cpu.tolist() == \
        p.local_cu_seqlens(rank).tolist()
    assert ctx.cu_seqlens.dtype == torch.int64 and ctx.cu_seqlens_cpu.device.type == "cpu"
    assert ctx.is_empty == (ctx.num_tokens == 0) and ctx.num_fragments == len(frags)
    assert [e.fragment for e in ctx.recv] == [i for i, f in enumerate(frags) if f.has_prev]
    assert [e.fragment for e in ctx.send] == [i for i, f in enumerate(frags) if f.has_next]
    for e in ctx.recv:
        f = frags[e.fragment]
        assert (e.doc, e.chain_pos) == (f.doc, f.chain_pos)
        assert e.predecessors == p.doc_chain(f.doc)[:f.chain_pos]
        assert e.prev[0] == f.prev_rank
    for e in ctx.send:
        f = frags[e.fragment]
        assert e.successors == p.doc_chain(f.doc)[f.chain_pos + 1:]
        assert e.next[0] == f.next_rank
    assert isinstance(ctx.exchange_plan, AllGatherPlan if exchange == "allgather" else RingPlan)
    check_halo(p, ctx)
    return ctx


def check_halo(p, ctx):
    own = _owners(p)
    cu = list(p.cu_seqlens)
    h = ctx.conv_kernel_size - 1
    frags = ctx.fragments
    assert [e.fragment for e in ctx.halo] == [i for i, f in enumerate(frags) if f.has_prev]
    for e in ctx.halo:
        f = frags[e.fragment]
        rows = {}
        for pc in e.pieces:
            src = p.fragments(pc.src_rank)[pc.src_fragment]
            assert src.doc == f.doc and pc.count >= 1
            assert src.local_offset <= pc.src_local_offset
            assert pc.src_local_offset + pc.count <= src.local_offset + src.length
            for k in range(pc.count):
                assert pc.halo_offset + k not in rows
                rows[pc.halo_offset + k] = (pc.src_rank, pc.src_local_offset + k)
        assert e.num_tokens == min(h, f.doc_offset)
        want = {}
        for j in range(h):
            pos = f.doc_offset - h + j  # document position of halo row j
            if pos >= 0:
                want[j] = own[cu[f.doc] + pos]
        assert rows == want
    # the sending side: every other rank's piece from this rank, in a fixed order
    expected = []
    for r in range(p.world_size):
        if r == ctx.rank:
            continue
        other = build_context(p, None, r, "cpu", ctx.conv_kernel_size, check_group=False)
        for e in other.halo:
            for pc in e.pieces:
                if pc.src_rank == ctx.rank:
                    expected.append((r, e.fragment, pc.src_fragment, pc.src_local_offset,
                                     pc.count, pc.halo_offset))
    got = [(s.dst_rank, s.dst_fragment, s.src_fragment, s.src_local_offset, s.count,
            s.halo_offset) for s in ctx.halo_send]
    assert got == sorted(expected, key=lambda x: (x[0], x[1], x[5]))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("w", WORLDS)
@pytest.mark.parametrize("cu", CU_CASES)
def test_contexts_and_halos(cu, w, layout):
    p = Partition.from_cu_seqlens(cu, w, layout)
    for r in range(w):
        for conv in (1, 4, 9):  # halo of 8 rows: longer than many fragments
            check_context(p, r, conv)


def test_halo_spans_several_ranks():
    # one doc of 6 tokens over 6 ranks, conv 5: the last fragment's halo is 4 rows from
    # ranks 1..4, one token each
    p = Partition.from_cu_seqlens([0, 6], 6)
    ctx = build_context(p, None, 5, "cpu", 5, check_group=False)
    e, = ctx.halo
    assert e.num_tokens == 4
    assert [(pc.src_rank, pc.src_local_offset, pc.count, pc.halo_offset) for pc in e.pieces] \
        == [(1, 0, 1, 0), (2, 0, 1, 1), (3, 0, 1, 2), (4, 0, 1, 3)]
    # the second fragment's halo: only one real token (the document starts), right-aligned
    e1, = build_context(p, None, 1, "cpu", 5, check_group=False).halo
    assert e1.num_tokens == 1 and [(pc.src_rank, pc.halo_offset) for pc in e1.pieces] == \
        [(0, 3)]
    # rank 2 sends its token to ranks 3, 4 and 5
    c2 = build_context(p, None, 2, "cpu", 5, check_group=False)
    assert [(s.dst_rank, s.halo_offset) for s in c2.halo_send] == [(3, 3), (4, 2), (5, 1)]


def _fold_check(p):
    """Simulate both exchanges with scalar affine maps (S_end = a*S_start + b per fragment,
    dS_start = a*dS_end + g); the plans must reproduce the sequential chain exactly."""
    rng = random.Random(3)
    w = p.world_size
    coef = {(r, i): (rng.randint(-3, 3), rng.randint(-9, 9), rng.randint(-9, 9))
            for r in range(w) for i in range(len(p.fragments(r)))}
    # ground truth along each chain
    s_in, ds_out = {}, {}
    for d in range(p.num_docs):
        chain = p.doc_chain(d)
        s = 0
        for fr in chain:
            s_in[fr] = s
            a, b, _ = coef[fr]
            s = a * s + b
        ds = 0
        for fr in reversed(chain):
            ds_out[fr] = ds
            a, _, g = coef[fr]
            ds = a * ds + g
    ctxs = [build_context(p, None, r, "cpu", check_group=False) for r in range(w)]
    ag = ctxs[0].allgather_plan
    # forward all-gather: each rank writes its send fragments' summaries in slot order
    gathered = [None] * (w * ag.fwd_slots_per_rank)
    for r, c in enumerate(ctxs):
        for k, e in enumerate(c.send):
            gathered[ag.fwd_index(r, k)] = coef[(r, e.fragment)][:2]
    for r, c in enumerate(ctxs):
        for e in c.recv:
            s = 0
            for row in e.gather_sources:
                a, b = gathered[row]
                s = a * s + b
            assert s == s_in[(r, e.fragment)]
    gathered = [None] * (w * ag.bwd_slots_per_rank)
    for r, c in enumerate(ctxs):
        for k, e in enumerate(c.recv):
            a, _, g = coef[(r, e.fragment)]
            gathered[ag.bwd_index(r, k)] = (a, g)
    for r, c in enumerate(ctxs):
        for e in c.send:
            ds = 0
            for row in e.gather_sources:
                a, g = gathered[row]
                ds = a * ds + g
            assert ds == ds_out[(r, e.fragment)]
    assert ag.fwd_slots_per_rank == max((len(c.send) for c in ctxs), default=0)
    assert ag.bwd_slots_per_rank == max((len(c.recv) for c in ctxs), default=0)
    # ring: hand-offs in plan order; a state is sent only once its fragment has its input
    ring = ctxs[0].ring_plan
    known = {fr: 0 for d in range(p.num_docs) for fr in p.doc_chain(d)[:1]}
    for h in ring.handoffs:
        src = (h.src_rank, h.src_fragment)
        assert src in known, "sent before its own state arrived"
        a, b, _ = coef[src]
        known[(h.dst_rank, h.dst_fragment)] = a * known[src] + b
        assert 0 <= h.step < ring.num_steps
        assert p.fragments(h.src_rank)[h.src_fragment].chain_pos == h.step
    assert known == s_in
    steps = [h.step for h in ring.handoffs]
    assert steps == sorted(steps)
    assert ring.num_steps == max([0] + [len(p.doc_chain(d)) - 1 for d in range(p.num_docs)])
    for r in range(w):
        assert ring.for_rank(r) == tuple(h for h in ring.handoffs
                                         if r in (h.src_rank, h.dst_rank))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("w", WORLDS)
@pytest.mark.parametrize("cu", CU_CASES)
def test_exchange_plans_fold_the_chain(cu, w, layout):
    _fold_check(Partition.from_cu_seqlens(cu, w, layout))


def test_exchange_plans_explicit_tables():
    rng = random.Random(11)
    for _ in range(40):
        lens = [rng.choice([0, 1, 3, 8]) for _ in range(rng.randint(1, 4))]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        w = rng.randint(1, 4)
        rows = []
        for d, n in enumerate(lens):
            off = 0
            while off < n:
                k = rng.randint(1, n - off)
                rows.append((rng.randrange(w), d, off, k))
                off += k
        rng.shuffle(rows)
        _fold_check(Partition.from_fragments(rows, w, cu[-1], cu_seqlens=cu))


def test_bytes_per_collective():
    # one doc of 16 over 2 ranks, zigzag: chain 0 -> 1 -> 0
    p = Partition.from_cu_seqlens([0, 16], 2, "zigzag")
    K, V, HV = 4, 8, 2
    c0 = build_context(p, None, 0, "cpu", check_group=False)
    b = c0.bytes_per_collective(K, V, HV, torch.float32)
    row = HV * K * (K + V) * 4
    assert (b.exchange, b.fwd_sent, b.fwd_received, b.fwd_buffer, b.fwd_calls) == \
        ("allgather", row, row, 2 * row, 1)
    assert (b.bwd_sent, b.bwd_received, b.bwd_buffer, b.bwd_calls) == (row, row, 2 * row, 1)
    assert b.total_sent == 2 * row
    state = HV * K * V * 2
    c0r = build_context(p, None, 0, "cpu", exchange="ring", check_group=False)
    b = c0r.bytes_per_collective(K, V, HV, torch.bfloat16)
    assert (b.exchange, b.fwd_sent, b.fwd_received, b.fwd_calls) == ("ring", state, state, 2)
    assert (b.bwd_sent, b.bwd_received) == (state, state)
    # contiguous, 3 ranks, one doc: rank 0 only sends, rank 2 only receives
    p = Partition.from_cu_seqlens([0, 9], 3)
    c = [build_context(p, None, r, "cpu", exchange="ring", check_group=False) for r in range(3)]
    st = HV * K * V * 4
    assert [(x.fwd_sent, x.fwd_received, x.bwd_sent, x.bwd_received) for x in
            (cc.bytes_per_collective(K, V, HV) for cc in c)] == \
        [(st, 0, 0, st), (st, st, st, st), (0, st, st, 0)]
    # nothing crosses: no collective at all
    p = Partition.from_cu_seqlens([0, 3, 6], 2)
    b = build_context(p, None, 1, "cpu", check_group=False).bytes_per_collective(K, V, HV)
    assert (b.fwd_sent, b.fwd_buffer, b.fwd_calls, b.bwd_calls) == (0, 0, 0, 0)
    assert not build_context(p, None, 1, "cpu", check_group=False).crosses
    for bad in [(0, V, HV), (K, V, 1.5)]:
        with pytest.raises(ValueError):
            c0.bytes_per_collective(*bad)
    with pytest.raises(ValueError, match="^dtype"):
        c0.bytes_per_collective(K, V, HV, "fp32")


def test_halo_bytes():
    p = Partition.from_cu_seqlens([0, 6], 6)
    c2 = build_context(p, None, 2, "cpu", 5, check_group=False)
    b = c2.halo_bytes(16, torch.bfloat16)
    # rank 2 sends its one token to 3 ranks; receives 2 tokens (from ranks 0 and 1)
    assert (b.fwd_sent, b.fwd_received, b.bwd_sent, b.bwd_received) == \
        (3 * 32, 2 * 32, 2 * 32, 3 * 32)
    assert b.fwd_calls == 5


def test_build_context_single_process_checks():
    p1 = Partition.from_cu_seqlens([0, 5, 9], 1)
    ctx = build_context(p1, None, 0, torch.device("cpu"))
    assert ctx.world_size == 1 and ctx.rank == 0 and ctx.exchange == "allgather"
    assert ctx.conv_kernel_size == 4 and ctx.cu_seqlens.tolist() == [0, 5, 9]
    assert ctx.recv == () and ctx.send == () and ctx.halo == ()
    ctx.check_num_tokens(torch.zeros(1, 9, 2), "q")
    ctx.check_num_tokens(9)
    with pytest.raises(ValueError, match="^q: holds 8 tokens, but rank 0's context has 9"):
        ctx.check_num_tokens(torch.zeros(1, 8, 2), "q")
    with pytest.raises(ValueError, match="^g: expected a token dim"):
        ctx.check_num_tokens(torch.zeros(9), "g")
    p2 = Partition.from_cu_seqlens([0, 5, 9], 2)
    with pytest.raises(ValueError, match="^partition: made for world_size 2"):
        build_context(p2, None, 0, "cpu")
    with pytest.raises(ValueError, match="^rank"):
        build_context(p1, None, 1, "cpu")
    with pytest.raises(ValueError, match="^partition"):
        build_context(p1.to_dict(), None, 0, "cpu")
    with pytest.raises(ValueError, match="^exchange"):
        build_context(p1, None, 0, "cpu", exchange="reduce")
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="^conv_kernel_size"):
            build_context(p1, None, 0, "cpu", bad)
    with pytest.raises(ValueError, match="^check_group"):
        build_context(p1, None, 0, "cpu", check_group=1)
    with pytest.raises(ValueError, match="^rank"):
        build_context(p2, None, 2, "cpu", check_group=False)
    for bad in ("gpu0", 3.5):
        with pytest.raises(ValueError, match="^device: not a device"):
            build_context(p1, None, 0, bad)
    if not torch.cuda.is_available():
        for bad in ("cuda", 0, torch.device("cuda", 1)):
            with pytest.raises(ValueError, match="^device: .*no usable CUDA device"):
                build_context(p1, None, 0, bad)
    else:
        with pytest.raises(ValueError, match="^device: .*CUDA devices are visible"):
            build_context(p1, None, 0, torch.cuda.device_count())


# ---------------------------------------------------------------- gloo, 2 processes

_GLOO_WORKER = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from cake_core.kcp import Partition, build_context

    def worker(rank, world, init):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        try:
            cu = torch.tensor([0, 3, 10, 10, 16], dtype=torch.int64)
            for layout in ("contiguous", "zigzag"):
                p = Partition.from_cu_seqlens(cu, world, layout)
                keys = [None] * world
                dist.all_gather_object(keys, (p.key, hash(p)))
                assert len(set(keys)) == 1, keys
                for exchange in ("allgather", "ring"):
                    for group in (None, dist.group.WORLD):
                        ctx = build_context(p, group, rank, "cpu", 4, exchange=exchange)
                        assert ctx.rank == rank and ctx.world_size == world
                        assert ctx.num_tokens == p.local_num_tokens(rank)
                        assert ctx.cu_seqlens.tolist() == p.local_cu_seqlens(rank).tolist()
                try:
                    build_context(Partition.from_cu_seqlens(cu, world + 1, layout), None,
                                  rank, "cpu")
                except ValueError as e:
                    assert str(e).startswith("partition: made for world_size 3"), e
                else:
                    raise AssertionError("a partition of another world size was accepted")
                try:
                    build_context(p, None, 1 - rank, "cpu")
                except ValueError as e:
                    assert str(e).startswith(f"rank: got {1 - rank}, but this process is rank "
                                             f"{rank}"), e
                else:
                    raise AssertionError("a context for another rank was accepted")
            dist.barrier()
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, "file://" + sys.argv[1]), nprocs=2, join=True)
        print("ok")
""")


def test_kcp_entry_helpers_single_process():
    """The bodies every ``-kcp`` family's partition / context entries share."""
    assert partition_det_kcp([0, 5, 9], 2, "zigzag") == Partition.from_cu_seqlens([0, 5, 9], 2,
                                                                                  "zigzag")
    table = [(0, 0, 0, 5), (1, 1, 0, 4)]
    for cu in ([0, 5, 9], torch.tensor([0, 5, 9])):
        assert partition_det_kcp(cu, 2, fragments=table) == Partition.from_fragments(
            table, 2, 9, cu_seqlens=[0, 5, 9])
    with pytest.raises(ValueError, match="^layout: 'zigzag' cannot be combined"):
        partition_det_kcp([0, 5, 9], 2, "zigzag", fragments=table)
    with pytest.raises(ValueError, match="^cu_seqlens_global_cpu: expected a 1-D tensor"):
        partition_det_kcp(torch.zeros(2, 2, dtype=torch.int64), 2, fragments=table)
    with pytest.raises(ValueError, match="^cu_seqlens_global_cpu: expected a CPU int tensor"):
        partition_det_kcp([], 2, fragments=table)
    with pytest.raises(ValueError, match=r"^partition: expected a cake_core.kcp.Partition \(from "
                                         r"partition_det_kcp\), got dict"):
        build_context_det_kcp({}, None, 0, "cpu")
    p1 = Partition.from_cu_seqlens([0, 5, 9], 1)
    ctx = build_context_det_kcp(p1, None, 0, "cpu", exchange="ring")
    assert ctx.exchange == "ring" and check_entry_context(ctx) is ctx
    assert check_entry_context(ctx, torch.device("cpu")) is ctx
    with pytest.raises(ValueError, match=r"^ctx: expected a cake_core.kcp.Context \(from "
                                         r"build_context_det_kcp\), got Partition"):
        check_entry_context(p1)
    p2 = Partition.from_cu_seqlens([0, 5, 9], 2)
    with pytest.raises(ValueError, match="^ctx: made for world_size 2, but torch.distributed"):
        check_entry_context(build_context(p2, None, 0, "cpu", check_group=False))
    with pytest.raises(ValueError, match="^ctx: built for device cpu, but the tensors are on "
                                         "meta"):
        check_entry_context(ctx, torch.device("meta"))
    assert not has_middle_fragments(p1) and not has_middle_fragments(p2)
    assert has_middle_fragments(Partition.from_cu_seqlens([0, 9], 3))


def test_gloo_two_processes(tmp_path):
    script = tmp_path / "kcp_gloo_worker.py"
    script.write_text(_GLOO_WORKER)
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "rdzv")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


_AGREE_WORKER = textwrap.dedent("""
    import sys, time
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from cake_core.kcp import Partition, agree_once, build_context

    def raises(fn, *needles):
        t = time.monotonic()
        try:
            fn()
        except ValueError as e:
            msg = str(e)
            assert all(n in msg for n in needles), msg
            assert time.monotonic() - t < 30, "took too long"
            return msg
        raise AssertionError("no ValueError")

    def worker(rank, world, init):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        try:
            same = Partition.from_cu_seqlens([0, 7, 16], world)
            ctx = build_context(same, None, rank, "cpu", 4)
            calls = []
            real = dist.all_gather
            dist.all_gather = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
            agree_once(ctx, "f", K=64, dtype=torch.bfloat16)
            agree_once(ctx, "f", K=64, dtype=torch.bfloat16)  # agreed: no collective
            assert len(calls) == 1, calls
            dist.all_gather = real
            # rank 1 given another partition: every rank raises, naming the partition
            mine = same if rank == 0 else Partition.from_cu_seqlens([0, 9, 16], world)
            ctx2 = build_context(mine, None, rank, "cpu", 4)
            raises(lambda: agree_once(ctx2, "f", K=64), "f: the ranks of ctx.group disagree",
                   "partition: rank 0", "rank 1")
            # another option on rank 1 (head count): named with both values
            ctx3 = build_context(same, None, rank, "cpu", 4)
            msg = raises(lambda: agree_once(ctx3, "g", HV=4 + rank, K=64), "HV: rank 0 4, rank 1 5")
            assert "partition" not in msg and "K:" not in msg, msg
            dist.barrier()
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2, "file://" + sys.argv[1]), nprocs=2, join=True)
        print("ok")
""")


def test_agree_once_gloo(tmp_path):
    """Two gloo ranks: agreeing ranks compare once per entry and context; a rank given
    another partition or option makes every rank raise, within seconds, naming what
    differs."""
    script = tmp_path / "kcp_agree_worker.py"
    script.write_text(_AGREE_WORKER)
    env = dict(os.environ, PYTHONPATH=":".join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "rdzv")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_agree_once_single_process():
    ctx = build_context(Partition.from_cu_seqlens([0, 5, 9], 1), None, 0, "cpu")
    agree_once(ctx, "f", K=3)  # no torch.distributed: nothing to compare
    assert "f" in ctx.__dict__["_agreed_entries"]


def test_zigzag_per_document_layout():
    """Every document in 2W parts; rank r holds part r then part 2W-1-r of each, in
    document order (adjacent parts merge into one fragment)."""
    p = Partition.from_cu_seqlens([0, 8, 20, 20, 21], 2, "zigzag_per_document")
    got = [[(f.doc, f.doc_offset, f.length) for f in p.fragments(r)] for r in range(2)]
    # a 1-token document is its last part (2W-1 = 3): rank 0's
    assert got[0] == [(0, 0, 2), (0, 6, 2), (1, 0, 3), (1, 9, 3), (3, 0, 1)]
    assert got[1] == [(0, 2, 4), (1, 3, 6)]
    assert p.local_num_tokens(0) == 11 and p.local_num_tokens(1) == 10
    assert p.layout == "zigzag_per_document"
    assert Partition.from_dict(p.to_dict()) == p
    # every rank gets an equal share of each long enough document's causal work
    q = Partition.from_cu_seqlens([0, 64, 192], 4, "zigzag_per_document")
    for d in range(2):
        per_rank = [sum(f.length for f in q.fragments(r) if f.doc == d) for r in range(4)]
        assert len(set(per_rank)) == 1, per_rank
