""".ci/run installs the envs' shared base (noxfile.py's BASE and the build tool hatchling)
at the versions the noxfile pins: else each CI env silently installs its own torch again
(noxfile.py ``_base_in_system``), or tests run against other versions."""

from __future__ import annotations

import ast
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
