"""``nox -l`` prints a session's docstring up to its first line break: every session's
docstring is one line, so that the listing shows its whole description."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_session(dec: ast.expr) -> bool:
    f = dec.func if isinstance(dec, ast.Call) else dec
    return isinstance(f, ast.Attribute) and f.attr == "session"


def test_every_session_has_a_one_line_description():
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    sessions = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                and any(_is_session(d) for d in n.decorator_list)]
    assert len(sessions) >= 9, [n.name for n in sessions]
    for n in sessions:
        doc = ast.get_docstring(n, clean=False)
        assert doc and doc.strip(), f"session {n.name} has no docstring"
        assert "\n" not in doc.strip(), f"session {n.name}: nox -l shows only its first line"
