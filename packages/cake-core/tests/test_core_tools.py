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


@pytest.mark.parametrize("name", [
    "cake-core", "cake-tinylm", "cake-gdn-det-train", "cake-gdn-det-train-kcp",
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
