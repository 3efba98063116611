""".ci/run installs the envs' shared base (noxfile.py's BASE and the build tool hatchling)
at the versions the noxfile pins: else each CI env silently installs its own torch again
(noxfile.py ``_base_in_system``), or tests run against other versions."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _noxfile_list(name: str) -> list[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name} = [...]")


def test_ci_installs_the_noxfile_base():
    text = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if "torch==" in ln and "pip install" in ln]
    assert len(lines) == 1, lines
    got = set(re.findall(r'"([^"]+)"', lines[0]))
    want = set(_noxfile_list("BASE")) | {_noxfile_list("BUILD_TOOLS")[0]}
    assert got == want, (got ^ want)
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("torch==") < ci.index("nox -s lint tests")


def _noxfile_function(name: str):
    """One function of noxfile.py, run without nox (the manifest session's env has none)."""
    import functools
    import subprocess
    import sys

    src = (ROOT / "noxfile.py").read_text()
    tree = ast.parse(src)
    ns = {"functools": functools, "os": os, "subprocess": subprocess, "sys": sys,
          "_PIP_SOURCES": _noxfile_tuple("_PIP_SOURCES")}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            exec(compile(ast.Module([node], []), "noxfile.py", "exec"), ns)
            return ns[name]
    raise AssertionError(f"noxfile.py has no {name}()")


def _noxfile_tuple(name: str) -> tuple:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name} = (...)")


def test_nox_takes_cpu_torch_only_where_pip_has_no_sources(monkeypatch, tmp_path):
    """noxfile.py ``_pip_has_sources``: pip told of an index or local wheels (environment or
    config file) keeps its sources; with none, envs that install their own torch take it
    from PyTorch's CPU index."""
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    has = lambda: _noxfile_function("_pip_has_sources")()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no config files
    assert has() is False
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.setenv(var, "/opt/wheels" if "LINKS" in var else "1")
        assert has() is True, var
        monkeypatch.delenv(var)
    for section, key in (("global", "find-links"), ("install", "index-url"),
                         ("global", "extra-index-url")):
        conf = tmp_path / f"{section}-{key}.conf"
        conf.write_text(f"[{section}]\n{key} = file:///somewhere\n")
        monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
        assert has() is True, (section, key)
    conf = tmp_path / "other.conf"
    conf.write_text("[global]\ntimeout = 60\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    if not any(p.is_file() for p in (Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"),
                                     Path.home() / ".config/pip/pip.conf",
                                     Path.home() / ".pip/pip.conf")):
        assert has() is False  # other options: no source of its own
    assert any(b.startswith("torch==") for b in _noxfile_list("BASE"))  # what _install pins
