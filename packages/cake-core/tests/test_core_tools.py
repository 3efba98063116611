"""Testing helpers, naming rules, build manifests, family discovery, Triton helpers."""

import subprocess
import sys

import pytest
import torch
from cake_core import naming, testing
from cake_core.build import source_digest, validate_manifest


def test_rel_fro_and_tolerances():
    r = torch.randn(100, dtype=torch.float64)
    assert testing.rel_fro_error(r, r) == 0.0
    assert testing.rel_fro_error(r * (1 + 1e-3), r) == pytest.approx(1e-3)
    testing.assert_close_to_reference(r.float(), r, torch.float32)
    with pytest.raises(AssertionError, match="relative Frobenius"):
        testing.assert_close_to_reference(r.float() * 1.1, r, torch.float32)
    with pytest.raises(AssertionError, match="non-finite"):
        testing.assert_close_to_reference(testing.poison_(r.clone()), r, torch.float64)


def test_bitwise_repeat_can_fail():
    x = torch.randn(10)
    testing.assert_bitwise_repeat(lambda: (x * 2, None))
    counter = iter(range(10))
    with pytest.raises(AssertionError, match="differs in bits"):
        testing.assert_bitwise_repeat(lambda: x + next(counter) * 1e-3)
    assert not testing.bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    nan = torch.tensor([float("nan")])
    assert testing.bitwise_equal(nan, nan.clone())


def test_ragged_cu_seqlens():
    g = torch.Generator().manual_seed(1)
    cu = testing.ragged_cu_seqlens(8, 37, generator=g)
    lens = (cu[1:] - cu[:-1]).tolist()
    assert cu[0] == 0 and 0 in lens and 1 in lens and cu.dtype == torch.int32
    from cake_core import check_cu_seqlens
    check_cu_seqlens(cu, int(cu[-1]))


def test_poison():
    assert torch.isnan(testing.poison_(torch.zeros(3))).all()
    assert (testing.poison_(torch.zeros(3, dtype=torch.int32)) == 2**31 - 1).all()


def test_poisoned_empty_block_only():
    real = torch.empty
    with testing.poisoned_empty() as shapes:
        assert torch.isnan(torch.empty(2, 3)).all()
        assert (torch.empty(4, dtype=torch.int64) == 2**63 - 1).all()
    assert shapes == [(2, 3), (4,)] and torch.empty is real
    with testing.poisoned_empty(floating_only=True):
        assert torch.isnan(torch.empty(2)).all()
        torch.empty(2, dtype=torch.int32)  # left as allocated
    with pytest.raises(RuntimeError), testing.poisoned_empty():
        raise RuntimeError("restored on an error too")
    assert torch.empty is real


@pytest.mark.parametrize("name", [
    "cake-core", "cake-tinylm", "cake-transformers", "cake-gdn-det-train",
    "cake-gdn-det-train-kcp",
    "cake-kda-det-train", "cake-kda-det-train-kcp", "cake-lm-head-loss-det-train",
    "cake-moe-grouped-det-gemm", "cake-dense-projection-det-gemm", "cake-mhc-det-train",
    "cake-rmsnorm-det-train", "cake-rmsnorm-silu-gate-det-train",
    "cake-causal-conv1d-det-train", "cake-causal-conv1d-det-train-kcp",
    "cake-gqa-train", "cake-dsa-train", "cake-mok-train", "cake-rmsnorm-nondet-train",
])
def test_canonical_names_pass(name):
    assert naming.check_name(name) == []


@pytest.mark.parametrize("name", [
    "cake-rmsnorm-train", "cake_rmsnorm_det_train", "rmsnorm-det-train",
    "cake-gdn-train-det", "cake-gqa-det-train", "cake-gdn-det-train-cp",
    "cake-moe-grouped-gemm",
])
def test_bad_names_fail(name):
    assert naming.check_name(name) != []


def test_parse_name():
    assert naming.parse_name("cake-gdn-det-train-kcp") == {
        "family": "gdn", "mode": "det", "op": "train", "kind": "kcp"}


def test_manifest_helpers(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "a.py").write_text("x = 1\n")
    d1 = source_digest(tmp_path)
    (tmp_path / "kernels" / "a.py").write_text("x = 2\n")
    assert d1 != source_digest(tmp_path) and d1.startswith("sha256:")
    assert validate_manifest({}) != []
    from cake_core.cake_build import MANIFEST
    assert validate_manifest(MANIFEST) == []


def test_kernel_digest(tmp_path):
    import hashlib
    import importlib.util
    from pathlib import Path

    from cake_core.build import kernel_digest

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "a.py").write_text("x = 1\n")
    own = source_digest(tmp_path)
    assert kernel_digest(tmp_path) == own
    mods = ("cake_core.varlen", "cake_core.gemm")
    h = hashlib.sha256(own.encode() + b"\0")
    for m in mods:
        h.update(Path(importlib.util.find_spec(m).origin).read_bytes() + b"\0")
    assert kernel_digest(tmp_path, mods) == "sha256:" + h.hexdigest()
    assert kernel_digest(tmp_path, mods[::-1]) != kernel_digest(tmp_path, mods)


def test_refusals_without_collectives():
    import torch.distributed as dist

    real = dist.barrier

    def collective():
        try:
            dist.barrier()
        except (RuntimeError, ValueError):  # no process group here: still counted
            pass
        raise ValueError("y: refused too late")

    def refuse():
        raise ValueError("x: bad")

    with testing.refusals_without_collectives() as (expect, msgs):
        assert dist.barrier is not real
        expect("refused", refuse)
        expect("went through", lambda: None)
        expect("collective", collective)
        with pytest.raises(KeyError):
            expect("other error", lambda: {}["k"])
        expect("after", refuse)
    assert dist.barrier is real
    assert msgs == ["refused: x: bad", "NO ERROR: went through", "collective: y: refused too late",
                    "COLLECTIVE in collective: ['barrier']", "after: x: bad"]


def test_offsets_cache_probes():
    """counting_offsets_cache / offsets_cache_disabled on the real cache and chunk tables;
    strided_cu_seqlens; no_kernel_launches."""
    from types import SimpleNamespace

    import cake_core.varlen as varlen

    real_check, real_tables = varlen.check_cu_seqlens, varlen.chunk_tables
    cu = torch.tensor([0, 0, 1, 70, 75], dtype=torch.int32)
    cpu = torch.device("cpu")
    with testing.counting_offsets_cache(varlen, "chunk_tables") as counts:
        assert len(varlen._cache) == 0  # a clean cache
        seqs = varlen.resolve_chunks(cu, 1, 75, cpu, 64)
        assert counts == {"reads": 1, "tables": 1}
        off = varlen.checked_offsets(cu, 75)
        assert off is seqs.offsets  # hits: nothing counted
        assert varlen.resolve_chunks(cu, 1, 75, cpu, 64) is seqs
        assert counts == {"reads": 1, "tables": 1}
        with testing.offsets_cache_disabled():
            off2 = varlen.checked_offsets(cu, 75)
            varlen.resolve_chunks(cu, 1, 75, cpu, 64)
        assert off2 is not off and counts == {"reads": 3, "tables": 2}
        assert varlen.checked_offsets(cu, 75) is off  # enabled again, the entry kept
        assert counts["reads"] == 3
    assert varlen.check_cu_seqlens is real_check and varlen.chunk_tables is real_tables
    assert len(varlen._cache) == 0  # cleared on exit
    with pytest.raises(AttributeError):
        with testing.counting_offsets_cache(varlen, "no_such_builder"):
            pass
    assert varlen.check_cu_seqlens is real_check

    s, base = testing.strided_cu_seqlens((0, 2, 5), torch.int64)
    assert s.tolist() == [0, 2, 5] and s.stride() == (2,) and s.dtype == torch.int64
    assert s._base is base and base.tolist() == [0, 10**6, 2, 10**6, 5, 10**6]
    with pytest.raises(ValueError, match="values must not be empty"):
        testing.strided_cu_seqlens((), torch.int32)

    def kernel():
        pass

    mod = SimpleNamespace(kernel=kernel, launch=len)
    with testing.no_kernel_launches(mod, "kernel", "launch"):
        with pytest.raises(AssertionError, match=r"a kernel was launched \(kernel\)"):
            mod.kernel[(1,)]
        with pytest.raises(AssertionError, match=r"a kernel was launched \(launch\)"):
            mod.launch([])
    assert mod.kernel is kernel and mod.launch is len
    with pytest.raises(AttributeError):
        with testing.no_kernel_launches(mod, "kernel", "missing"):
            pass
    assert mod.kernel is kernel


def test_computed_once_shares_one_result(tmp_path_factory):
    """The first call computes and saves; a later call (another xdist worker's, whose
    base folder lies in the same run folder) loads the saved result without computing."""
    calls = []

    def compute():
        calls.append(1)
        return {"t": torch.arange(3.0), "n": len(calls)}

    first = testing.computed_once(tmp_path_factory, "core_tools_once", compute)
    again = testing.computed_once(tmp_path_factory, "core_tools_once", compute)
    assert calls == [1] and first["n"] == again["n"] == 1
    assert torch.equal(first["t"], again["t"])


def test_family_discovery_does_not_import_triton():
    code = ("import sys; from cake_core.families import list_families; "
            "fams = list_families(); "
            "assert 'triton' not in sys.modules, 'triton imported'; "
            "print(','.join(f.name for f in fams))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    names = out.stdout.strip().split(",")
    try:
        from importlib.metadata import distribution
        distribution("cake-core")
    except Exception:
        pytest.skip("cake-core not installed (running from source): no entry points")
    assert "cake-core" in names


# tl comes from cake_core.triton_utils: it imports Triton after choosing the backend.
from cake_core.triton_utils import default_device, dot, is_interpreting, tl, triton  # noqa: E402


@triton.jit
def _dot_kernel(A, B, C, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * N + r[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])
    acc = tl.zeros([N, N], dtype=tl.float32)  # not inline: see cake_core.triton_utils.dot
    acc = dot(a, b, acc)
    tl.store(C + r[:, None] * N + r[None, :], acc)


def test_interpreter_safe_dot():
    dev = default_device()
    assert is_interpreting() == (dev.type == "cpu")
    a = torch.randn(16, 16).to(dev, torch.bfloat16)
    b = torch.randn(16, 16).to(dev, torch.bfloat16)
    c = torch.empty(16, 16, device=dev)
    _dot_kernel[(1,)](a, b, c, N=16)
    ref = a.double() @ b.double()
    assert testing.rel_fro_error(c, ref) < 1e-5


def test_lazy_exports():
    from cake_core.lazy import lazy_exports

    ga, di = lazy_exports("cake_core", {"check_name": "naming"}, ["check_name"])
    assert ga("check_name") is naming.check_name and di() == ["check_name"]
    with pytest.raises(AttributeError):
        ga("nothing")


def test_same_output_across_processes_can_fail():
    assert testing.assert_same_output_across_processes("print(6 * 7)") == "42"
    with pytest.raises(AssertionError, match="differ across processes"):
        testing.assert_same_output_across_processes("import os; print(os.getpid())")
    with pytest.raises(AssertionError, match="process failed"):
        testing.assert_same_output_across_processes("raise SystemExit(3)")


def test_bad_input_table_helpers():
    made = []

    def base(n=2):
        made.append(n)
        return {"x": torch.ones(n), "scale": 1.0}

    make = testing.args_with(base, base={"n": 3}, x=lambda a: a["x"][None], y=lambda a: a["x"])
    for _ in range(2):  # each call builds fresh arguments, base's keywords kept
        args = make()
        assert args["x"].shape == (1, 3) and args["y"] is args["x"] and args["scale"] == 1.0
    assert made == [3, 3] and testing.args_with(base)()["x"].shape == (2,)

    def check(x, scale, y=None):
        if x.dim() != 1:
            raise ValueError(f"x: expected 1-D, got {x.dim()}-D")

    e = testing.assert_raises_unmodified(check, make(), "x: expected 1-D")
    assert isinstance(e, ValueError)
    with pytest.raises(AssertionError, match="does not match"):
        testing.assert_raises_unmodified(check, make(), "y: ")
    with pytest.raises(AssertionError, match="no ValueError raised"):
        testing.assert_raises_unmodified(check, {"x": torch.ones(2), "scale": 1.0}, "x")

    def spoil(x, scale, y=None):
        x.zero_()
        raise ValueError("x: bad")

    with pytest.raises(AssertionError, match="tensor argument 0 was modified"):
        testing.assert_raises_unmodified(spoil, make(), "x: bad")
    meta = {"x": torch.ones(2, device="meta"), "scale": 1.0}  # meta tensors are skipped
    with pytest.raises(AssertionError, match="no ValueError raised"):
        testing.assert_raises_unmodified(check, meta, "x")


def test_autograd_comparison_helpers():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0])

    def loss(x, y, k):
        out = x * k + y.sum()
        return out.sum(), out, 2 * y

    got = testing.leaf_grads(loss, (a, b), 3.0)
    assert [t.tolist() for t in got] == [[6.0, 9.0], [6.0], [3.0, 3.0], [2.0]]
    assert not a.requires_grad and a.grad is None and not got[0].requires_grad
    testing.assert_bitwise_equal_named(got, [t.clone() for t in got], "oypq")
    with pytest.raises(AssertionError, match="o: compiled differs"):
        testing.assert_bitwise_equal_named([torch.tensor([0.0])], [torch.tensor([-0.0])], "o",
                                           "compiled differs")
    for bad in ([None], [torch.tensor([1.0], dtype=torch.float64)], [torch.tensor([1.0, 1.0])],
                [torch.tensor([float("inf")])]):
        with pytest.raises(AssertionError):
            testing.assert_bitwise_equal_named(bad, [torch.tensor([1.0])], "o")
    torch._dynamo.reset()
    testing.assert_compile_same_bits(lambda x, y: torch.sin(x) * y, (a, torch.tensor([2.0, 5.0])),
                                     "aot_eager")


def test_imports_without_triton():
    testing.assert_imports_without_triton("cake_core", "cake_core.testing")
    with pytest.raises(AssertionError, match="triton imported"):
        testing.assert_imports_without_triton("cake_core.triton_utils")


def test_compiles_to_op():
    def step(x, k):
        y = torch.sin(x) * k
        return y.sum(), y

    x = torch.tensor([0.5, 1.0])
    compiled = testing.assert_compiles_to_op(step, (x,), (3.0,), ("y", "dx"),
                                             backend="aot_eager", op="torch.sin")
    assert float(compiled(x, 1.0)[0]) == float(torch.sin(x).sum())
    with pytest.raises(AssertionError, match="torch.cos not in the traced graph"):
        testing.assert_compiles_to_op(step, (x,), (3.0,), ("y", "dx"), backend="aot_eager",
                                      op="torch.cos")


def test_cdiv():
    from cake_core.triton_utils import cdiv

    assert [cdiv(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_import_cake_core_applies_the_backend_rule_without_triton():
    """``import cake_core`` sets TRITON_INTERPRET=1 on a machine without CUDA (unless set)
    and imports no Triton, so a later torch.compile (which imports Triton) still finds the
    interpreter."""
    import os
    import subprocess
    import sys

    code = ("import os, sys, torch; os.environ.pop('TRITON_INTERPRET', None); "
            "import cake_core; assert 'triton' not in sys.modules; "
            "print(os.environ.get('TRITON_INTERPRET'), torch.cuda.is_available())")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == (["None", "True"] if out[1] == "True" else ["1", "False"])


def _in_thread(fn):
    """fn() in a new thread (Triton's allocator is per thread: a new one starts unset)."""
    import threading

    out = {}
    t = threading.Thread(target=lambda: out.update(value=fn()))
    t.start()
    t.join()
    return out["value"]


def test_ensure_scratch_allocator_sets_torch_once_per_thread_and_keeps_a_users():
    import triton
    from cake_core.triton_utils import ensure_scratch_allocator
    from triton.runtime import _allocation

    def unset_then_ensured():
        was_null = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
        ensure_scratch_allocator()
        buf = _allocation._allocator.get()(256, 128, None)
        return was_null, buf.numel(), buf.dtype

    assert _in_thread(unset_then_ensured) == (True, 256, torch.int8)

    def users_kept():
        def mine(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(mine)
        ensure_scratch_allocator()
        return _allocation._allocator.get() is mine

    assert _in_thread(users_kept)
