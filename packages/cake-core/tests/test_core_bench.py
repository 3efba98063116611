"""cake_core.bench: the benchmarks' argument parsers, run records, timers and result helpers
(the CPU paths; the CUDA-only timers run in the GPU benchmarks)."""

import argparse
import hashlib
import json

import pytest
import torch
from cake_core import bench
from cake_core.testing import assert_imports_without_triton, bits


def test_import_does_not_import_triton():
    assert_imports_without_triton("cake_core.bench")


def test_parse_shapes_default_rules():
    assert bench.parse_shapes(" 64X32 ,, 8x4", 2, "TxH") == [(64, 32), (8, 4)]
    for text, msg in (("64x32x2", r"^bad shape '64x32x2'; expected TxH, e\.g\. 1x2$"),
                      ("1x-3", r"^bad shape '1x-3'; sizes must be positive$"),
                      (" , ", "^no shapes given$")):
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            bench.parse_shapes(text, 2, "TxH, e.g. 1x2")
    with pytest.raises(ValueError):  # argparse: "invalid <type> value"
        bench.parse_shapes("axb", 2, "TxH")


def test_parse_shapes_strict():
    assert bench.parse_shapes("64x32x1000", 3, "TxHxV", strict=True) == [(64, 32, 1000)]
    for text, item in (("1x0x3", "1x0x3"), ("1x2x3,", ""), ("axbxc", "axbxc"),
                       ("1x2", "1x2"), (" 1x2", " 1x2")):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=f"^bad shape {item!r}; expected TxHxV$"):
            bench.parse_shapes(text, 3, "TxHxV", strict=True)


def test_parse_names_and_overrides():
    known = ("cake", "fla")
    assert bench.parse_names(" cake, fla ,", known) == ["cake", "fla"]
    assert bench.parse_names(",", known) == []
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"^unknown impls \['foo'\]; known: \['cake', 'fla'\]$"):
        bench.parse_names("cake,foo", known, what="impls")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^unknown \[\]; known: "):
        bench.parse_names(",", known, allow_empty=False)
    assert bench.parse_overrides(["block_v=32", "keep_a=0"]) == {"block_v": 32, "keep_a": 0}
    assert bench.parse_overrides([]) == {}


def test_run_records(tmp_path, capsys):
    assert bench.utc_now().endswith("+00:00")
    assert bench.device_description("cpu").startswith("cpu (")
    assert bench.dist_version("torch") is not None
    assert bench.dist_version("no-such-distribution-xyz", "torch") == bench.dist_version("torch")
    assert bench.dist_version("no-such-distribution-xyz") is None
    err = ValueError("x" * 3000 + "  \n")
    assert bench.short_error(err) == ("ValueError: " + "x" * 3000)[:2000]
    assert len(bench.short_error(err, 100)) == 100
    try:
        raise KeyError("boom")
    except KeyError as e:
        rec = bench.error_record(e)
        tail = bench.traceback_tail(20)
    assert rec["status"] == "error" and rec["error"] == "KeyError: 'boom'"
    assert "KeyError" in rec["traceback"] and len(tail) <= 20
    path = tmp_path / "sub" / "out.json"
    bench.write_json(str(path), {"a": 1, "d": torch.float32})
    assert json.loads(path.read_text()) == {"a": 1, "d": "torch.float32"}
    assert path.read_text().startswith('{\n  "a"')
    assert not (tmp_path / "sub" / "out.json.tmp").exists()
    bench.write_json(str(path), {"b": [1]}, indent=1)
    assert path.read_text() == '{\n "b": [\n  1\n ]\n}'
    bench.write_json(None, {"a": 1})
    bench.free_memory("cpu")
    assert not bench.cuda_missing("cpu")
    if not torch.cuda.is_available():
        assert bench.cuda_missing("cuda", "no GPU here")
        assert capsys.readouterr().err == "no GPU here\n"

    def make(name):
        if name == "bad":
            raise ImportError("not installed")
        return name.upper()

    assert bench.load_impls(["a", "bad", "b"], make) == {"a": "A", "b": "B"}
    assert "bad: unavailable (ImportError: not installed)" in capsys.readouterr().out


def test_cpu_timers():
    calls = []
    times = bench.time_calls(lambda: calls.append(1), 2, 5, "cpu")
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    s = bench.summarize_ms([5.0, 1.0, 4.0, 2.0, 3.0, 9.0])
    assert s == {"ms": 3.5, "p20_ms": 2.0, "p80_ms": 5.0}
    timer = bench.Timer("cpu", True, None, None)
    assert (timer.warmup, timer.rep) == (1, 3) and timer.kind.startswith("time.perf_counter")
    timer = bench.Timer("cpu", False, None, 4, cpu_quick=(0, 1), cpu_full=(1, 3))
    assert (timer.warmup, timer.rep) == (1, 4)
    calls.clear()
    out = timer.bench(lambda: calls.append(1))
    assert len(calls) == 5 and set(out) == {"ms", "p20_ms", "p80_ms"}
    timer.sync()
    cuda = bench.Timer("cuda", True, None, None)
    assert (cuda.warmup, cuda.rep) == (5.0, 20.0) and "do_bench" in cuda.kind


def test_repeat_hashes_names_the_outputs_that_differ(capsys):
    fixed = [torch.tensor([1.0, 2.0]), None, torch.tensor([3.0])]
    same = bench.repeat_hashes(lambda: fixed, ("a", "b", "c"), runs=3)
    assert len(same) == 3 and len(set(same)) == 1
    assert same[0] == bench.bits_sha256(fixed)[:16] and capsys.readouterr().out == ""
    n = [0]

    def drifting():  # "c" takes a new value on every other call, "a" never changes
        n[0] += 1
        return [fixed[0], None, torch.tensor([float(n[0] // 2)])]

    got = bench.repeat_hashes(drifting, ("a", "b", "c"), runs=4)
    assert len(set(got)) == 3
    assert "{'c': 3}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="3 outputs for 2 names"):
        bench.repeat_hashes(lambda: fixed, ("a", "b"))


def test_result_helpers():
    ref = torch.tensor([1.0, -4.0, 2.0])
    out = torch.tensor([1.5, -4.0, 2.0], dtype=torch.bfloat16)
    assert bench.err_stats(out, ref) == {"max_abs": 0.5, "max_rel_to_max": 0.125}
    assert bench.err_stats(out, torch.zeros(3))["max_rel_to_max"] == 4.0
    assert bench.max_rel_error(out, ref) == 0.125
    assert bench.max_rel_error(out, ref, torch.float32) == 0.125
    assert bench.max_rel_error(torch.ones(2), torch.zeros(2)) == pytest.approx(1e30)
    ts = [torch.arange(6, dtype=torch.bfloat16).view(2, 3).t(), None, torch.tensor([-0.0])]
    h = hashlib.sha256()
    for t in (ts[0], ts[2]):
        h.update(bits(t).numpy().tobytes())
    assert bench.bits_sha256(ts) == h.hexdigest()
    assert bench.bits_sha256([torch.tensor([0.0])]) != bench.bits_sha256([torch.tensor([-0.0])])
    rec = {"fwd": {"ms": 2.0}, "bwd": {"ms": 0.0}}
    bench.add_bandwidth(rec, {"fwd": 4e9, "bwd": 1, "fwdbwd": 1}, 4000.0,
                        ("fwd", "bwd", "fwdbwd"))
    assert rec["fwd"] == {"ms": 2.0, "gbps": 2000.0, "pct_peak": 50.0}
    assert rec["bwd"]["gbps"] != rec["bwd"]["gbps"]  # NaN for a zero time
    impls = {"cake": {"fwd": {"ms": 1.0}}, "fla": {"fwd": {"ms": 4.0}, "bwd": {"ms": 1.0}},
             "torch": {"status": "error"}}
    assert bench.cake_ratios(impls, ("fla", "liger", "torch"), ("fwd", "bwd")) == {
        "fla": {"fwd": 0.25, "bwd": None}, "torch": {"fwd": None, "bwd": None}}
    assert bench.fmt(None, ".2f") == "—" and bench.fmt(float("nan"), ".2f") == "—"
    assert bench.fmt(1.234, ".2f") == "1.23"


def test_compare_cases(capsys):
    def time_impl(fn, c):
        if fn == "broken":
            raise RuntimeError("no kernel")
        return {"fwd_ms": fn * c, "bwd_ms": 2.0 * fn, "fwd_bwd_ms": 3.0 * fn}

    profiled = []
    out = bench.compare_cases(["a", "b"], lambda n: {"a": 1.0, "b": 2.0}[n],
                              {"cake": 1.0, "fla": 2.0, "x": "broken"}, time_impl=time_impl,
                              hashes=lambda fn, c: [str(fn)], profile=lambda fn, c:
                              profiled.append((fn, c)), profile_case="b")
    assert out["a"]["cake"] == {"fwd_ms": 1.0, "bwd_ms": 2.0, "fwd_bwd_ms": 3.0}
    assert out["a"]["ratio"] == {"fwd_ms": 0.5, "bwd_ms": 0.5, "fwd_bwd_ms": 0.5}
    assert out["b"]["x"] == "failed: RuntimeError: no kernel" and out["b"]["x_hash"] == ["broken"]
    assert profiled == [(1.0, 2.0), (2.0, 2.0)]
    printed = capsys.readouterr().out
    assert "a cake/fla {'fwd_ms': 0.5" in printed and "b x failed: RuntimeError" in printed
    only_hash = bench.compare_cases(["a"], lambda n: 1.0, {"cake": 1.0},
                                    hashes=lambda fn, c: ["h"])
    assert only_hash == {"a": {"cake_hash": ["h"]}}
