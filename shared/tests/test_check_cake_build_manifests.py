"""The manifest checker catches every kind of finding planted in a scratch copy of a package.

Run by ``nox -s manifests`` (or ``python3 -m pytest -q shared/tests``): needs ``packaging``
and ``hatchling``, not torch, Triton or a GPU. Each test copies one package to a temporary
folder, plants one defect and checks it with the real monorepo as the root (siblings,
cake-core and the name registry come from there).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "shared" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


chk = _load("check_cake_build_manifests")

LOCAL = "cake-rmsnorm-det-train"
KCP = "cake-gdn-det-train-kcp"


def scratch(tmp_path: Path, dist: str = LOCAL) -> Path:
    dst = tmp_path / dist
    shutil.copytree(ROOT / "packages" / dist, dst,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def findings(pkg_dir: Path, build: bool = False) -> list:
    pkg = chk.load_package(pkg_dir)
    tree = chk.Tree(ROOT, [pkg])
    out, _ = chk.check_packages(tree, [pkg], do_build=build)
    return out


def kinds(fs) -> set[str]:
    return {f.kind for f in fs}


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def src(pkg_dir: Path) -> Path:
    (d,) = (pkg_dir / "src").iterdir()
    return d


def test_the_tree_has_no_static_findings():
    assert chk.main(["--no-build"]) == 0


def test_an_untouched_copy_builds_with_no_findings(tmp_path):
    assert findings(scratch(tmp_path), build=True) == []


def test_file_left_out_of_the_wheel(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", "[tool.hatch.build.targets.wheel]\n",
         '[tool.hatch.build.targets.wheel]\nexclude = ["**/reference.py"]\n')
    fs = findings(d, build=True)
    assert any(f.kind == "wheel-missing" and "reference.py" in f.detail for f in fs), fs


def test_file_in_the_wheel_not_in_the_source_tree(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", "[tool.hatch.build.targets.wheel]\n",
         "[tool.hatch.build.targets.wheel.force-include]\n"
         '"README.md" = "cake_rmsnorm_det_train/EXTRA.md"\n\n'
         "[tool.hatch.build.targets.wheel]\n")
    fs = findings(d, build=True)
    assert any(f.kind == "wheel-extra" and "EXTRA.md" in f.detail for f in fs), fs


def test_build_failure(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", 'build-backend = "hatchling.build"',
         'build-backend = "no_such_backend_anywhere"')
    assert "build" in kinds(findings(d, build=True))


def test_missing_build_backend_gives_an_install_hint(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", '"hatchling>=', '"hatchling_gone>=')
    edit(d / "pyproject.toml", 'build-backend = "hatchling.build"',
         'build-backend = "hatchling_gone.build"')
    (f,) = findings(d, build=True)
    assert f.kind == "build" and "pip install 'hatchling_gone" in f.detail, f
    assert "Traceback" not in f.detail, f


@pytest.mark.parametrize("arg", ["packages/nope", "nope", "cake-nope-det-train"])
def test_bad_package_argument_is_a_clear_error(arg, capsys):
    with pytest.raises(SystemExit) as e:
        chk.main(["--no-build", arg])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{arg}: not a package folder" in err and "Traceback" not in err, err


def test_a_distribution_name_is_a_package_argument():
    assert chk.main(["--no-build", LOCAL]) == 0


def test_kernel_in_sources_not_listed(tmp_path):
    d = scratch(tmp_path)
    f = src(d) / "kernels" / "fwd.py"
    f.write_text(f.read_text() + "\n\n@triton.jit\ndef planted_kernel(X):\n    pass\n")
    fs = findings(d)
    assert any(f.kind == "kernel-unlisted" and "planted_kernel" in f.detail for f in fs), fs
    assert "digest-stale" in kinds(fs)  # the kernel sources changed as well


def test_kernel_listed_but_missing(tmp_path):
    d = scratch(tmp_path)
    edit(src(d) / "cake_build.py", "KERNELS = [\n",
         'KERNELS = [\n    {"module": "cake_rmsnorm_det_train.kernels.fwd", '
         '"function": "no_such_kernel"},\n')
    fs = findings(d)
    assert any(f.kind == "kernel-missing" and "no_such_kernel" in f.detail for f in fs), fs


def test_shared_kernel_listed_but_missing(tmp_path):
    d = scratch(tmp_path, "cake-rmsnorm-silu-gate-det-train")
    edit(src(d) / "cake_build.py", '"function": "ordered_sum_kernel"',
         '"function": "ordered_sum_kernel_v2"')
    fs = findings(d)
    assert any(f.kind == "kernel-missing" and "cake_core.gemm.ordered_sum_kernel_v2"
               in f.detail for f in fs), fs


def test_stale_digest(tmp_path):
    d = scratch(tmp_path)
    f = src(d) / "kernels" / "bwd.py"
    f.write_text(f.read_text() + "\n# a planted change\n")
    assert kinds(findings(d)) == {"digest-stale"}


def test_stale_digest_through_a_called_jit_function(tmp_path):
    """cake_core.gemm.matmul_kernel calls _mma, which calls cake_core.triton_utils.dot: a
    change to dot makes a family that lists matmul_kernel stale (issue 11 review, item 5)."""
    core = scratch(tmp_path, "cake-core")
    dense = scratch(tmp_path, "cake-dense-projection-det-gemm")
    pkgs = [chk.load_package(core), chk.load_package(dense)]
    tree = chk.Tree(ROOT, pkgs)
    k = {"module": "cake_core.gemm", "function": "matmul_kernel"}
    reached = chk.reached_kernels(tree, [k])
    assert ("cake_core.triton_utils", "dot") in reached, reached
    edit(src(core) / "triton_utils.py", "        return tl.dot(a, b, acc)\n",
         '        return tl.dot(a, b, acc, input_precision="tf32x3")\n')
    fs, _ = chk.check_packages(chk.Tree(ROOT, pkgs), pkgs, do_build=False)
    stale = {f.package for f in fs if f.kind == "digest-stale"}
    assert stale == {"cake-core", "cake-dense-projection-det-gemm"}, fs
    assert any("cake_core.triton_utils" in f.detail and "--write" in f.detail for f in fs), fs


def test_called_jit_function_through_a_module_alias(tmp_path):
    d = scratch(tmp_path)
    f = src(d) / "kernels" / "fwd.py"
    f.write_text(f.read_text() + "\n\nimport cake_core.triton_utils as _tu  # noqa: E402\n\n\n"
                 "@triton.jit\ndef planted_kernel(a, b, acc):\n    return _tu.dot(a, b, acc)\n")
    tree = chk.Tree(ROOT, [chk.load_package(d)])
    k = {"module": "cake_rmsnorm_det_train.kernels.fwd", "function": "planted_kernel"}
    assert chk.reached_kernels(tree, [k])[1:] == [("cake_core.triton_utils", "dot")]


@pytest.mark.parametrize("dist,rel,old,new", [
    # the MoE routing's stable sort of the assignments (issue 11 review, item 6)
    ("cake-moe-grouped-det-gemm", "moe.py",
     "sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)",
     "sorted_ids, order = torch.sort(ids.reshape(-1), stable=False)"),
    # a plan rule
    (LOCAL, "plan.py", "    format_version: ClassVar[int] = 1\n",
     "    format_version: ClassVar[int] = 1  # planted\n"),
])
def test_stale_digest_outside_the_kernel_modules(tmp_path, dist, rel, old, new):
    """Every module of the package but cake_build.py is digested."""
    d = scratch(tmp_path, dist)
    edit(src(d) / rel, old, new)
    assert kinds(findings(d)) == {"digest-stale"}


def test_stale_plans(tmp_path):
    d = scratch(tmp_path)
    edit(src(d) / "plan.py", "    format_version: ClassVar[int] = 1\n",
         "    format_version: ClassVar[int] = 1\n\n    planted_field: int = 0\n")
    fs = findings(d)
    assert any(f.kind == "plans-stale" and "RMSNormDetPlan" in f.detail for f in fs), fs


def test_unlisted_package_data(tmp_path):
    d = scratch(tmp_path)
    (src(d) / "py.typed").write_text("")
    assert "package-data" in kinds(findings(d))


def test_entry_point_that_is_not_public(tmp_path):
    d = scratch(tmp_path)
    edit(src(d) / "cake_build.py", '"RMSNorm"]', '"RMSNorm", "rmsnorm_gone"]')
    fs = findings(d)
    assert any(f.kind == "manifest" and "rmsnorm_gone" in f.detail for f in fs), fs


def test_missing_manifest(tmp_path):
    d = scratch(tmp_path)
    (src(d) / "cake_build.py").unlink()
    assert "manifest" in kinds(findings(d))


def test_sibling_registry_points_at_a_missing_kernel(tmp_path):
    d = scratch(tmp_path, KCP)
    edit(src(d) / "cake_build.py", '"function": "gdn_fwd_prep_kernel"',
         '"function": "gdn_fwd_prep_kernel_gone"')
    fs = findings(d)
    assert any(f.kind == "sibling-kernel" and "gdn_fwd_prep_kernel_gone" in f.detail
               for f in fs), fs


def test_sibling_registry_lags_the_sibling(tmp_path):
    """The sibling gained a kernel the KCP copy of its kernel list lacks."""
    d = scratch(tmp_path, KCP)
    line = ('{"module": "cake_gdn_det_train.kernels.fwd_prep", '
            '"function": "gdn_fwd_prep_kernel"},\n')
    edit(src(d) / "cake_build.py", " " * 8 + line, "")
    fs = findings(d)
    assert any(f.kind == "sibling-kernel" and "lacks cake_gdn_det_train.kernels.fwd_prep."
               "gdn_fwd_prep_kernel" in f.detail for f in fs), fs


def test_sibling_registry_points_at_a_missing_entry_point(tmp_path):
    d = scratch(tmp_path, KCP)
    edit(src(d) / "cake_build.py", '"make_plan"]', '"make_plan", "no_such_entry"]')
    fs = findings(d)
    assert any(f.kind == "sibling-kernel" and "no_such_entry" in f.detail for f in fs), fs


def test_sibling_registry_points_at_a_missing_package(tmp_path):
    d = scratch(tmp_path, KCP)
    edit(src(d) / "cake_build.py", '"name": "cake-gdn-det-train",',
         '"name": "cake-gdn-det-train-gone",')
    fs = findings(d)
    assert any(f.kind == "sibling-kernel" and "no such package" in f.detail for f in fs), fs


def test_sibling_registry_version_range_excludes_the_sibling(tmp_path):
    d = scratch(tmp_path, KCP)
    edit(src(d) / "cake_build.py", '"version_range": ">=0.1,<0.2"',
         '"version_range": ">=0.3,<0.4"')
    edit(d / "pyproject.toml", '"cake-gdn-det-train>=0.1,<0.2"', '"cake-gdn-det-train>=0.3,<0.4"')
    fs = findings(d)
    assert [f.kind for f in fs] == ["sibling-version"], fs
    assert "outside" in fs[0].detail


def test_sibling_registry_range_differs_from_pyproject(tmp_path):
    d = scratch(tmp_path, KCP)
    edit(d / "pyproject.toml", '"cake-gdn-det-train>=0.1,<0.2"', '"cake-gdn-det-train>=0.1"')
    fs = findings(d)
    assert [f.kind for f in fs] == ["sibling-version"], fs
    assert "pyproject.toml" in fs[0].detail


def test_dependency_range_excludes_a_bumped_package(tmp_path):
    """cake-rmsnorm-det-train bumped to 0.2.0: cake-tinylm and the legacy stub still pin
    <0.2 (issue 11 review, item 7)."""
    d = scratch(tmp_path)
    edit(src(d) / "__init__.py", '__version__ = "0.1.0"', '__version__ = "0.2.0"')
    edit(src(d) / "cake_build.py", '"version": "0.1.0"', '"version": "0.2.0"')
    tree = chk.Tree(ROOT, [chk.load_package(d)])
    pkgs = [tree.by_dist[n] for n in (LOCAL, "cake-tinylm", "cake-rmsnorm-train")]
    fs, _ = chk.check_packages(tree, pkgs, do_build=False)
    fs = [f for f in fs if f.kind != "digest-stale"]  # __init__.py changed: regenerate
    assert {(f.package, f.kind) for f in fs} == {("cake-tinylm", "dependency-version"),
                                                ("cake-rmsnorm-train", "dependency-version")}
    assert all("cake-rmsnorm-det-train>=0.1,<0.2" in f.detail and "0.2.0" in f.detail
               for f in fs), fs


def test_jit_aliases_and_jit_calls_are_kernels(tmp_path):
    """``from triton import jit as _jit; @_jit`` and ``k = triton.jit(fn)`` declare kernels
    too (issue 11 review, item 8)."""
    d = scratch(tmp_path)
    f = src(d) / "kernels" / "fwd.py"
    f.write_text(f.read_text() + "\n\nfrom triton import jit as _jit  # noqa: E402\n\n\n"
                 "@_jit\ndef planted_alias(X):\n    pass\n\n\n"
                 "def _planted_impl(X):\n    pass\n\n\n"
                 "planted_call = triton.jit(_planted_impl)\n")
    fs = findings(d)
    unlisted = " ".join(f.detail for f in fs if f.kind == "kernel-unlisted")
    assert "planted_alias" in unlisted and "planted_call" in unlisted, fs
    assert "_planted_impl" not in unlisted, fs


def test_missing_requires_python(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", 'requires-python = ">=3.10"\n', "")
    fs = findings(d, build=True)
    details = [f.detail for f in fs if f.kind == "requires-python"]
    assert any("pyproject.toml" in x for x in details), fs
    assert any("metadata" in x for x in details), fs  # the built wheel lacks it as well


def test_version_file_and_manifest_disagree(tmp_path):
    d = scratch(tmp_path)
    edit(src(d) / "__init__.py", '__version__ = "0.1.0"', '__version__ = "0.1.1"')
    fs = findings(d)
    assert any(f.kind == "version-mismatch" and "FAMILY" in f.detail for f in fs), fs


def test_metadata_version_differs_from_the_version_file(tmp_path):
    d = scratch(tmp_path)
    edit(d / "pyproject.toml", 'dynamic = ["version"]', 'version = "0.2.0"')
    fs = findings(d, build=True)
    details = [f.detail for f in fs if f.kind == "version-mismatch"]
    assert any("wheel metadata version 0.2.0" in x for x in details), fs
    assert any("sdist metadata version 0.2.0" in x for x in details), fs


def test_name_the_registry_does_not_know(tmp_path):
    d = scratch(tmp_path)
    new = "cake-rmsnorm-planted-det-train"
    edit(d / "pyproject.toml", f'name = "{LOCAL}"', f'name = "{new}"')
    edit(src(d) / "cake_build.py", f'"name": "{LOCAL}"', f'"name": "{new}"')
    fs = findings(d)
    assert any(f.kind == "name-unknown" and new in f.detail for f in fs), fs


def test_registry_kind_disagrees(tmp_path):
    d = scratch(tmp_path)
    edit(src(d) / "cake_build.py", '"kind": "local"', '"kind": "kcp"')
    fs = findings(d)
    assert any(f.kind == "name-unknown" and "kind" in f.detail for f in fs), fs


def test_every_kind_is_covered():
    """Each finding kind the checker documents has a planted test in this file."""
    text = Path(__file__).read_text()
    planted = set(re.findall(r'"([a-z]+(?:-[a-z]+)*)"', text)) & set(chk.KINDS)
    assert planted == set(chk.KINDS), set(chk.KINDS) - planted


def test_write_regenerates_a_stale_block(tmp_path):
    d = scratch(tmp_path)
    f = src(d) / "kernels" / "fwd.py"
    f.write_text(f.read_text() + "\n\n@triton.jit\ndef planted_kernel(X):\n    pass\n")
    (src(d) / "py.typed").write_text("")
    assert kinds(findings(d)) == {"kernel-unlisted", "digest-stale", "package-data"}
    assert chk.main(["--write", "--no-build", str(d)]) == 0
    text = (src(d) / "cake_build.py").read_text()
    assert '"function": "planted_kernel"' in text and 'PACKAGE_DATA = ["py.typed"]' in text
    assert findings(d, build=True) == []
    assert chk.main(["--write", "--no-build", str(d)]) == 0  # a second run changes nothing
    assert (src(d) / "cake_build.py").read_text() == text


@pytest.mark.parametrize("dist", [LOCAL, KCP, "cake-core"])
def test_manifest_module_is_plain_data(dist):
    """A cake_build.py imports nothing but the standard library's copy: it runs alone."""
    pkg = chk.load_package(ROOT / "packages" / dist)
    tree = __import__("ast").parse(pkg.manifest_file.read_text())
    imports = [n for n in tree.body if n.__class__.__name__ in ("Import", "ImportFrom")]
    assert [a.name for n in imports for a in n.names] == ["copy"]
    g = chk.load_manifest_module(pkg)
    assert g["manifest"]() == g["MANIFEST"] and g["manifest"]() is not g["MANIFEST"]


OLD_FORMAT = '''"""Build manifest of cake-rmsnorm-det-train (plain data)."""

from pathlib import Path

FAMILY = {
    "name": "cake-rmsnorm-det-train",
    "import_name": "cake_rmsnorm_det_train",
    "version": "0.1.0",
    "mode": "det",
    "kind": "local",
    "entry_points": ["rmsnorm_det", "rmsnorm_det_fwd", "rmsnorm_det_bwd", "RMSNorm"],
}

MANIFEST = {
    **FAMILY,
    "kernels": [
        {"module": "cake_rmsnorm_det_train.kernels.fwd", "function": "rmsnorm_fwd_kernel"},
        {"module": "cake_core.gemm", "function": "ordered_sum_kernel"},
    ],
    "plans": ["RMSNormDetPlan"],
    "package_data": [],
}


def manifest() -> dict:
    from cake_core.build import source_digest

    return {**MANIFEST, "source_digest": source_digest(Path(__file__).parent)}
'''


def test_init_converts_an_old_format_manifest(tmp_path):
    """The older format (digest computed at run time through cake_core) converts: FAMILY
    kept, other packages' kernels kept as SHARED_KERNELS, the generated block filled."""
    d = scratch(tmp_path)
    (src(d) / "cake_build.py").write_text(OLD_FORMAT)
    assert "manifest" in kinds(findings(d))  # calling manifest() imports cake_core (torch)
    assert chk.main(["--init", "--no-build", str(d)]) == 0
    g = chk.load_manifest_module(chk.load_package(d))
    assert g["FAMILY"]["entry_points"] == ["rmsnorm_det", "rmsnorm_det_fwd", "rmsnorm_det_bwd",
                                           "RMSNorm"]
    assert g["SHARED_KERNELS"] == [{"module": "cake_core.gemm",
                                    "function": "ordered_sum_kernel"}]
    assert findings(d, build=True) == []


def test_init_creates_a_missing_manifest(tmp_path):
    d = scratch(tmp_path, KCP)
    (src(d) / "cake_build.py").unlink()
    assert chk.main(["--init", "--no-build", str(d)]) == 0
    g = chk.load_manifest_module(chk.load_package(d))
    (r,) = g["REUSES"]  # the KCP sibling found through the registry and pyproject.toml
    assert (r["name"], r["version_range"]) == ("cake-gdn-det-train", ">=0.1,<0.2")
    assert r["kernels"] and g["MANIFEST"]["kernels"] == r["kernels"]


def test_digest_sources_is_order_free_and_byte_exact():
    b = chk.Tree(ROOT).build_mod
    a = [("pkg.kernels.fwd", b"x = 1\n"), ("cake_core.gemm", b"y = 2\n")]
    assert b.digest_sources(a) == b.digest_sources(a[::-1])
    assert b.digest_sources(a) != b.digest_sources([(a[0][0], b"x = 1\r\n"), a[1]])
    assert b.digest_sources(a) != b.digest_sources([("pkg.kernels.bwd", a[0][1]), a[1]])
    assert b.digest_sources([]).startswith("sha256:")
