"""The name registry: rules, every package under packages/ known and obeying them."""

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from cake_core import names
from cake_core.names import LEGACY, REGISTRY, NameEntry, by_dist, by_import, check_name_rules

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover
    tomllib = None

PACKAGES = Path(__file__).resolve().parents[2]
IN_REPO = (tomllib is not None and PACKAGES.name == "packages"
           and (PACKAGES / "cake-core" / "pyproject.toml").is_file())
in_repo = pytest.mark.skipif(not IN_REPO, reason="needs the packages/ folder and tomllib")


def _pyproject(d: Path) -> dict:
    return tomllib.loads((d / "pyproject.toml").read_text())


def _dep_names(meta: dict) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]
            for dep in meta["project"].get("dependencies", [])}


def test_registry_obeys_its_rules():
    assert names.check_registry() == []
    for e in REGISTRY:
        assert check_name_rules(e) == [], e.dist
        assert by_dist(e.dist) is e and by_import(e.import_name) is e


def test_canonical_names_and_exceptions():
    det = {e.dist for e in REGISTRY if e.mode == "det"}
    assert {"cake-gdn-det-train", "cake-gdn-det-train-kcp", "cake-kda-det-train",
            "cake-kda-det-train-kcp", "cake-lm-head-loss-det-train",
            "cake-moe-grouped-det-gemm", "cake-dense-projection-det-gemm",
            "cake-mhc-det-train", "cake-rmsnorm-det-train", "cake-rmsnorm-silu-gate-det-train",
            "cake-causal-conv1d-det-train", "cake-causal-conv1d-det-train-kcp",
            "cake-gqa-det-train"} == det
    exc = {e.family: e for e in REGISTRY if e.mode == "exception"}
    assert set(exc) == {"gqa", "dsa", "mok"}
    assert "atomic" in exc["gqa"].exception_reason and "atomic" in exc["dsa"].exception_reason
    assert "distributed determinism" in exc["mok"].exception_reason
    assert by_dist("cake-tinylm").kind == "job" and by_dist("cake-core").kind == "core"
    with pytest.raises(KeyError):
        by_dist("cake-rmsnorm-train")  # legacy, not canonical
    with pytest.raises(KeyError):
        by_import("cake_nope")


def test_legacy_map():
    tg = {old: [e.dist for e in t] for old, t in LEGACY.items()}
    assert tg == {
        "cake-gdn-train": ["cake-gdn-det-train-kcp"],
        "cake-kda-train": ["cake-kda-det-train", "cake-kda-det-train-kcp"],
        "cake-causal-conv1d-train": ["cake-causal-conv1d-det-train",
                                     "cake-causal-conv1d-det-train-kcp"],
        "cake-lm-head-loss-train": ["cake-lm-head-loss-det-train"],
        "cake-moe-grouped-gemm": ["cake-moe-grouped-det-gemm"],
        "cake-dense-projection-gemm": ["cake-dense-projection-det-gemm"],
        "cake-mhc-train": ["cake-mhc-det-train"],
        "cake-rmsnorm-train": ["cake-rmsnorm-det-train"],
        "cake-rmsnorm-silu-gate-train": ["cake-rmsnorm-silu-gate-det-train"],
    }
    assert names.legacy_targets("cake_kda_train")[1].kind == "kcp"
    assert names.is_known("cake_gdn_train") and not names.is_known("cake-gdn-nope")


@pytest.mark.parametrize("name,old", [
    ("rmsnorm_det", "rmsnorm"), ("partition_det_kcp", "partition_kcp"),
    ("chunk_gdn_det_bwd_kcp", "chunk_gdn_bwd_kcp"), ("RMSNormDetSavedSet", "RMSNormSavedSet"),
    ("KDADetKCPGrads", "KDAKCPGrads"), ("moe_grouped_det_gemm", "moe_grouped_gemm"),
    ("make_plan", "make_plan"), ("determinant", "determinant"), ("Detector", "Detector"),
])
def test_strip_det(name, old):
    assert names.strip_det(name) == old


def _bad(**kw) -> NameEntry:
    return dataclasses.replace(by_dist("cake-gdn-det-train-kcp"), **kw)


@pytest.mark.parametrize("entry,needle", [
    (_bad(dist="cake-gdn-train-det-kcp", import_name="cake_gdn_train_det_kcp"), "'det'"),
    (_bad(dist="cake-gdn-det-kcp-train", import_name="cake_gdn_det_kcp_train"), "last"),
    (_bad(dist="cake-gdn-train-kcp", import_name="cake_gdn_train_kcp"), "needs 'det'"),
    (_bad(import_name="cake_gdn_kcp"), "import name"),
    (_bad(dist="cake-gdn-det-train", import_name="cake_gdn_det_train"), "'-kcp'"),
    (_bad(dist="Cake-GDN-det-train-kcp", import_name="Cake_GDN_det_train_kcp"), "lower"),
    (_bad(mode="exception", dist="cake-gdn-train-kcp", import_name="cake_gdn_train_kcp",
          exception_reason="slow"), "only ['dsa', 'gqa', 'mok']"),
    (_bad(mode="exception", family="gqa", dist="cake-gqa-det-train-kcp",
          import_name="cake_gqa_det_train_kcp", exception_reason="atomics"), "not carry"),
    (_bad(mode="exception", family="gqa", dist="cake-gqa-train-kcp",
          import_name="cake_gqa_train_kcp"), "reason"),
    (_bad(exception_reason="why"), "only mode 'exception'"),
    (_bad(family="kda"), "family"),
    (_bad(mode="fast"), "mode"),
    (_bad(kind="job"), "'-kcp'"),
    (_bad(legacy=("gdn-train",)), "legacy"),
    (dataclasses.replace(by_dist("cake-tinylm"), dist="cake-tinylm-det",
                         import_name="cake_tinylm_det"), "only kernel families"),
])
def test_planted_bad_names_are_caught(entry, needle):
    problems = check_name_rules(entry)
    assert problems and any(needle in p for p in problems), problems


def test_registry_wide_problems_are_caught():
    reg = REGISTRY + (_bad(),)
    assert any("more than once" in p for p in names.check_registry(reg))
    reg = REGISTRY + (dataclasses.replace(by_dist("cake-kda-det-train"), dist="cake-x-det-train",
                                          import_name="cake_x_det_train", family="x",
                                          legacy=("cake-gdn-train",)),)
    assert any("one family's local and KCP" in p for p in names.check_registry(reg))
    lone = names._e("cake-y-det-train-kcp", "y", "det", "kcp", "lone")
    assert any("needs its family's local" in p for p in names.check_registry(REGISTRY + (lone,)))
    clash = names._e("cake-rmsnorm-train", "rmsnorm", "exception", "local", "x", reason="r")
    assert any("also a canonical" in p for p in names.check_registry(REGISTRY + (clash,)))


def _package_dirs() -> list[Path]:
    return sorted(d for d in PACKAGES.iterdir() if (d / "pyproject.toml").is_file())


def _family_decl(src: Path) -> dict | None:
    f = src / "cake_build.py"
    if not f.is_file():
        return None
    for node in ast.parse(f.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "FAMILY"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@in_repo
def test_every_package_is_registered_and_obeys_the_rules():
    kinds = {"core": "tool", "job": "tool", "integration": "tool", "local": "local",
             "kcp": "kcp"}
    seen = set()
    for d in _package_dirs():
        dist = _pyproject(d)["project"]["name"]
        assert dist == d.name, f"{d}: folder and distribution name differ"
        assert names.is_known(dist), f"{dist} is not in cake_core.names"
        seen.add(dist)
        if dist in LEGACY:
            src = d / "src" / names.import_name(dist)
            assert (src / "__init__.py").is_file() and (src / "__init__.pyi").is_file()
            deps = _dep_names(_pyproject(d))
            for t in LEGACY[dist]:
                assert t.dist in deps, f"{dist} must depend on {t.dist}"
            continue
        e = by_dist(dist)
        assert check_name_rules(e) == [] and not e.planned, dist
        src = d / "src" / e.import_name
        assert (src / "__init__.py").is_file(), f"{dist}: no src/{e.import_name}"
        decl = _family_decl(src)
        if decl is not None:
            assert decl["name"] == dist and decl["import_name"] == e.import_name
            assert decl["kind"] == kinds[e.kind], dist
            assert decl["mode"] == e.mode, dist
    # every non-planned canonical entry has its folder (mhc is added by its own branch)
    missing = {e.dist for e in REGISTRY if not e.planned} - seen
    assert missing <= {"cake-mhc-det-train"}, missing


@in_repo
def test_the_check_catches_a_planted_unknown_package(tmp_path):
    bad = tmp_path / "cake-gdn-train-det"
    bad.mkdir()
    (bad / "pyproject.toml").write_text('[project]\nname = "cake-gdn-train-det"\n')
    dist = _pyproject(bad)["project"]["name"]
    assert not names.is_known(dist)
    e = names._e(dist, "gdn", "det", "local", "planted")
    assert any("'det'" in p for p in check_name_rules(e))


def _load_script(name: str):
    import importlib.util

    path = PACKAGES.parent / "shared" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_cake_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@in_repo
def test_committed_names_doc_matches_the_registry():
    doc = PACKAGES.parent / "docs" / "training_backend_names.md"
    assert doc.read_text() == names.render_names_doc(), "stale doc: run `nox -s names_doc`"
    assert _load_script("names_doc").main(["--check"]) == 0
    text = doc.read_text()
    for e in REGISTRY:
        assert f"`{e.dist}`" in text and f"`{e.import_name}`" in text
        if e.exception_reason:
            assert e.exception_reason in text
    for old in LEGACY:
        assert f"`{old}`" in text
    for promise in ("same hardware", "same execution plan", "initial accumulation buffers",
                    "across GPU architectures", "context-parallel partitions"):
        assert promise in text


@in_repo
def test_committed_legacy_packages_match_the_generator(capsys):
    assert _load_script("legacy_packages").main(["--check"]) == 0, capsys.readouterr().out


@in_repo
def test_readme_lists_canonical_and_legacy_names_side_by_side():
    text = (PACKAGES.parent / "README.md").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| `cake-")]
    for old, targets in LEGACY.items():
        row = [r for r in rows if f"| `{old}` |" in r]
        assert row, f"README: no row for legacy {old}"
        assert all(f"`{t.dist}`" in row[0] for t in targets), row[0]


@in_repo
def test_names_doc_help_prints_help_and_writes_nothing(capsys, monkeypatch):
    script = _load_script("names_doc")
    monkeypatch.setattr(script, "DOC", Path("/nonexistent/never-written.md"))
    with pytest.raises(SystemExit) as e:
        script.main(["--help"])
    assert e.value.code == 0 and "--check" in capsys.readouterr().out
