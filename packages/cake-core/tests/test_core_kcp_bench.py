"""cake_core.kcp_bench: the context-parallel benchmarks' documents, arguments and timing (the
CPU paths; the launch runs in each ``-kcp`` package's benchmark smoke test)."""

import argparse

import pytest
import torch
from cake_core import kcp_bench
from cake_core.testing import assert_imports_without_triton


def test_import_does_not_import_triton():
    assert_imports_without_triton("cake_core.kcp_bench")


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_documents(layout):
    T, W = 1000, 4
    cuts = kcp_bench.rank_cuts(T, W, layout)
    assert len(cuts) == (W - 1 if layout == "contiguous" else 2 * W - 1)
    for boundary in ("none", "on", "after", "random"):
        for docs in (1, 2, 5, 12):
            cu = kcp_bench.make_cu(T, docs, boundary, layout, W, seed=3)
            assert cu[0] == 0 and cu[-1] == T and len(cu) == docs + 1
            assert all(a < b for a, b in zip(cu, cu[1:], strict=False)), cu
            inner = set(cu[1:-1])
            if boundary == "on":
                assert inner <= set(cuts) or set(cuts) <= inner
            if boundary == "after":
                after = {c + 1 for c in cuts}
                assert inner <= after or after <= inner
            if boundary == "none":
                assert not inner & (set(cuts) | {c + 1 for c in cuts})
    assert kcp_bench.make_cu(10, 3, "random", layout, 2, 5) == kcp_bench.make_cu(
        10, 3, "random", layout, 2, 5)
    assert kcp_bench.make_cu(1, 1, "none", layout, 2, 0) == [0, 1]
    assert kcp_bench.make_cu(3, 3, "random", layout, 2, 0) == [0, 1, 2, 3]
    assert kcp_bench.rank_cuts(1, 2, layout) == []


def _parser():
    p = argparse.ArgumentParser()
    kcp_bench.add_document_args(p)
    kcp_bench.add_run_args(p, cuda_warmup=2, cuda_reps=10,
                           extra=lambda q: q.add_argument("--flag", action="store_true"))
    return p


def test_arguments(capsys):
    p = _parser()
    a = p.parse_args(["--seqlen", "8", "--docs", "3", "--flag"])
    assert (a.seqlen, a.docs, a.flag, a.world_size, a.dtype) == (8, 3, True, None, "bf16")
    assert kcp_bench.warmup_reps(a, torch.device("cpu"), 2, 10) == (0, 1)
    assert kcp_bench.warmup_reps(a, torch.device("cuda"), 2, 10) == (2, 10)
    a = p.parse_args(["--warmup", "4", "--reps", "5"])
    assert kcp_bench.warmup_reps(a, torch.device("cuda"), 2, 10) == (4, 5)
    for argv, msg in ((["--seqlen", "0"], "--seqlen must be >= 1"),
                      (["--docs", "9", "--seqlen", "8"], "--docs must be <= --seqlen")):
        a = p.parse_args(argv)
        with pytest.raises(SystemExit):
            kcp_bench.check_positive(p, a, ("seqlen", "docs"))
            kcp_bench.check_docs(p, a)
        assert msg in capsys.readouterr().err


def test_sha_is_short_bits_hash():
    x = torch.arange(4, dtype=torch.float32)
    assert kcp_bench.sha([x]) == kcp_bench.sha([x.clone()]) and len(kcp_bench.sha([x])) == 16
    assert kcp_bench.sha([x]) != kcp_bench.sha([x + 1])
