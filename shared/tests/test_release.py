"""Release tags and the release checks of shared/release.py (build and version; the clean
install runs in ``nox -s "release(core)"``, which ``nox -s tests`` includes)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "shared" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


rel = _load("release")


@pytest.mark.parametrize("tag,dist,version", [
    ("cake-core-v0.1.0", "cake-core", "0.1.0"),
    ("cake-gdn-det-train-kcp-v0.1.0", "cake-gdn-det-train-kcp", "0.1.0"),
    ("cake-rmsnorm-det-train-v1.2.0rc1", "cake-rmsnorm-det-train", "1.2.0rc1"),
])
def test_parse_tag(tag, dist, version):
    assert rel.parse_tag(tag, dist) == Version(version)


@pytest.mark.parametrize("tag,dist,match", [
    ("cake-gdn-det-train-v0.1.0", "cake-gdn-det-train-kcp", "releases 'cake-gdn-det-train'"),
    ("cake-core-0.1.0", "cake-core", "is not <dist-name>-v<version>"),
    ("v0.1.0", "cake-core", "is not <dist-name>-v<version>"),
    ("cake-core-vnext", "cake-core", "is not"),
])
def test_bad_tags(tag, dist, match):
    with pytest.raises(rel.ReleaseError, match=match):
        rel.parse_tag(tag, dist)


def test_tag_sources(monkeypatch):
    monkeypatch.setenv("CAKE_RELEASE_TAG", "cake-core-v9.9.9")
    assert rel.find_tag("cake-core") == "cake-core-v9.9.9"
    assert rel.find_tag("cake-core", "cake-core-v1.0.0") == "cake-core-v1.0.0"
    monkeypatch.delenv("CAKE_RELEASE_TAG")
    assert rel.find_tag("cake-core", root=Path("/nonexistent-cake-root")) is None


def test_release_tag_of_another_distribution_in_the_environment_is_ignored(
        tmp_path, monkeypatch, capsys):
    """CAKE_RELEASE_TAG set for one family does not fail another family's release check
    (``nox -s tests`` runs release(core)); a malformed one is still refused."""
    monkeypatch.setenv("CAKE_RELEASE_TAG", "cake-rmsnorm-det-train-v0.2.0")
    assert rel.find_tag("cake-core", root=Path("/nonexistent-cake-root")) is None
    assert "ignoring CAKE_RELEASE_TAG=cake-rmsnorm-det-train-v0.2.0" in capsys.readouterr().err
    assert rel.find_tag("cake-rmsnorm-det-train") == "cake-rmsnorm-det-train-v0.2.0"
    assert rel.release("cake-core", out=tmp_path / "o", install=False,
                       root=_scratch_root(tmp_path)) == Version("0.1.0")
    monkeypatch.setenv("CAKE_RELEASE_TAG", "v0.1.0")
    with pytest.raises(rel.ReleaseError, match="is not <dist-name>-v<version>"):
        rel.release("cake-core", out=tmp_path / "o", install=False,
                    root=_scratch_root(tmp_path / "b"))


def test_local_closure():
    tree = _load("check_cake_build_manifests").Tree(ROOT)
    names = [p.dist for p in rel.local_closure(tree, "cake-gdn-det-train-kcp")]
    assert names[0] == "cake-gdn-det-train-kcp"
    assert sorted(names[1:]) == ["cake-core", "cake-gdn-det-train"]
    assert [p.dist for p in rel.local_closure(tree, "cake-core")] == ["cake-core"]


def _scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "packages" / "cake-core", root / "packages" / "cake-core",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def test_release_dry_run_builds_and_checks_the_version(tmp_path, monkeypatch):
    monkeypatch.delenv("CAKE_RELEASE_TAG", raising=False)
    root = _scratch_root(tmp_path)
    out = tmp_path / "out"
    assert rel.release("cake-core", out=out, install=False, root=root) == Version("0.1.0")
    assert sorted(p.name for p in out.iterdir()) == ["cake_core-0.1.0-py3-none-any.whl",
                                                     "cake_core-0.1.0.tar.gz"]
    assert rel.release("cake-core", tag="cake-core-v0.1.0", out=out, install=False,
                       root=root) == Version("0.1.0")


def test_release_refuses_a_tag_that_is_not_the_built_version(tmp_path):
    root = _scratch_root(tmp_path)
    with pytest.raises(rel.ReleaseError, match="wants 0.2.0"):
        rel.release("cake-core", tag="cake-core-v0.2.0", out=tmp_path / "o", install=False,
                    root=root)
    with pytest.raises(rel.ReleaseError, match="releases 'cake-rmsnorm-det-train'"):
        rel.release("cake-core", tag="cake-rmsnorm-det-train-v0.1.0", out=tmp_path / "o",
                    install=False, root=root)


def test_release_refuses_manifest_findings(tmp_path):
    """A version bumped in the version file only: the manifest's FAMILY version is stale."""
    root = _scratch_root(tmp_path)
    init = root / "packages/cake-core/src/cake_core/__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', '__version__ = "0.2.0"'))
    with pytest.raises(rel.ReleaseError, match="version-mismatch"):
        rel.release("cake-core", tag="cake-core-v0.2.0", out=tmp_path / "o", install=False,
                    root=root)


def test_release_notes_the_packages_whose_pins_exclude_it(tmp_path, capsys):
    root = tmp_path / "repo"
    for d in ("cake-core", "cake-rmsnorm-det-train"):
        shutil.copytree(ROOT / "packages" / d, root / "packages" / d,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pyproject = root / "packages/cake-rmsnorm-det-train/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"cake-core>=0.1,<0.2"',
                                                       '"cake-core>=0.0,<0.1"'))
    assert rel.release("cake-core", out=tmp_path / "o", install=False, root=root) == \
        Version("0.1.0")
    out = capsys.readouterr().out
    assert "note: cake-rmsnorm-det-train pins a range without 0.1.0" in out, out


def test_release_finds_the_tag_at_head(tmp_path, monkeypatch):
    """A tagged commit: the tag at HEAD is the release's; another family's tag is ignored."""
    import subprocess

    monkeypatch.delenv("CAKE_RELEASE_TAG", raising=False)
    root = _scratch_root(tmp_path)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"],
                ["tag", "cake-rmsnorm-det-train-v0.3.0"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    assert rel.find_tag("cake-core", root=root) is None
    subprocess.run(git + ["tag", "cake-core-v0.1.0"], check=True)
    assert rel.find_tag("cake-core", root=root) == "cake-core-v0.1.0"
    assert rel.release("cake-core", out=tmp_path / "o", install=False, root=root) == \
        Version("0.1.0")
    subprocess.run(git + ["tag", "cake-core-v0.1.1"], check=True)
    with pytest.raises(rel.ReleaseError, match="several release tags"):
        rel.find_tag("cake-core", root=root)
