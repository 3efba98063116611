"""The package imports no other family: only ``cake_core``, its det sibling
``cake_kda_det_train`` and itself (no GDN, no other family, no KCP package), by static
imports or literal module names handed to ``importlib.import_module`` / ``__import__``;
and the det sibling imports no nondet package (det never depends on nondet)."""

import ast
import importlib.util
from pathlib import Path

PKG = Path(__file__).resolve().parents[1]
ALLOWED = {"cake_core", "cake_kda_det_train", "cake_kda_nondet_train"}


def cake_imports(source: str) -> set[str]:
    """Top-level ``cake_*`` modules ``source`` imports: ``import`` / ``from ... import``
    anywhere (functions and ``TYPE_CHECKING`` blocks too) and ``import_module`` /
    ``__import__`` calls with a literal module (first positional, ``name=`` or
    ``package=``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call):
            f = node.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in (
                    "import_module", "__import__"):
                args = list(node.args[:1]) + [k.value for k in node.keywords
                                              if k.arg in ("name", "package")]
                names = [a.value for a in args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        found |= {n.lstrip(".").split(".")[0] for n in names
                  if n.lstrip(".").startswith("cake_")}
    return found


def _imports_of(root: Path) -> set[str]:
    files = sorted(root.rglob("*.py"))
    assert files, root
    return set().union(*(cake_imports(p.read_text()) for p in files))


def test_sources_import_no_foreign_family():
    got = _imports_of(PKG / "src") | _imports_of(PKG / "benchmarks")
    assert got <= ALLOWED, got - ALLOWED
    assert "cake_kda_det_train" in got  # the scan sees real imports


def test_det_sibling_imports_no_nondet_package():
    det = Path(importlib.util.find_spec("cake_kda_det_train").origin).parent
    got = _imports_of(det)
    assert "cake_kda_det_train" in got
    assert not {m for m in got if "nondet" in m}, got


def test_scan_catches_each_form():
    for code in ("import cake_gdn_det_train", "from cake_gdn_nondet_train.api import x",
                 "def f():\n    import cake_kda_nondet_train_kcp\n",
                 "import importlib\nimportlib.import_module('cake_gdn_det_train.api')",
                 "m = __import__('cake_rmsnorm_det_train')"):
        assert cake_imports(code) - ALLOWED, code
    assert cake_imports("x = 'cake_gdn_det_train'  # a string") == set()
