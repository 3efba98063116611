"""The package imports no ``cake_kda*`` module: a scan of its sources for static imports
and for literal module names handed to ``importlib.import_module`` / ``__import__``, with
regression cases proving the scan catches each form; and a fresh process that imports and
runs the package loads none."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
FORBIDDEN = "cake_kda"
_DYNAMIC = {"import_module", "__import__"}


def _forbidden(name: object) -> bool:
    return isinstance(name, str) and (name == FORBIDDEN or name.startswith(FORBIDDEN))


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def scan(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every import of a ``cake_kda*`` module in ``source``: ``import``
    and ``from ... import`` statements (also inside functions and ``TYPE_CHECKING`` blocks),
    and calls of ``importlib.import_module`` / ``import_module`` / ``__import__`` whose
    module argument (first positional or ``name=``) is a literal, or whose ``package=`` is."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            hits += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                     if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if _forbidden(node.module or ""):
                hits.append(f"{filename}:{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if fname not in _DYNAMIC:
                continue
            args = [a for a in node.args[:1]] + [k.value for k in node.keywords
                                                 if k.arg in ("name", "package")]
            for a in args:
                lit = _literal(a)
                if _forbidden(lit) or (lit and lit.lstrip(".").startswith(FORBIDDEN)):
                    hits.append(f"{filename}:{node.lineno}: {fname}({lit!r})")
    return hits


def _sources():
    files = sorted((PKG / "src").rglob("*.py")) + sorted((PKG / "benchmarks").rglob("*.py"))
    assert len(files) >= 7, files
    return files


def test_sources_import_no_kda_module():
    hits = [h for p in _sources() for h in scan(p.read_text(), str(p.relative_to(PKG)))]
    assert hits == []


@pytest.mark.parametrize("code", [
    "import cake_kda_det_train",
    "import os, cake_kda_det_train.api as kda",
    "from cake_kda_det_train import chunk_kda_det",
    "from cake_kda_det_train.kernels import chunk_fwd",
    "def f():\n    from cake_kda_det_train_kcp import x\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cake_kda_det_train\n",
    "import importlib\nm = importlib.import_module('cake_kda_det_train')",
    "import importlib\nm = importlib.import_module(name='cake_kda_det_train.api')",
    "from importlib import import_module\nm = import_module('cake_kda_det_train_kcp')",
    "import importlib\nm = importlib.import_module('.api', package='cake_kda_det_train')",
    "m = __import__('cake_kda_det_train')",
    "m = __import__('cake_kda_det_train.api', fromlist=['x'])",
    "import builtins\nm = builtins.__import__('cake_kda')",
])
def test_scan_catches(code):
    """Regression: each way of importing a KDA module is found (a dynamic import too)."""
    assert len(scan(code)) == 1, (code, scan(code))


@pytest.mark.parametrize("code", [
    "import cake_gdn_det_train",
    "import importlib\nm = importlib.import_module('cake_gdn_det_train')",
    "name = 'cake_kda_det_train'  # a string, not an import",
    "m = __import__('cake_core')",
])
def test_scan_passes(code):
    assert scan(code) == []


def test_running_the_package_loads_no_kda_module():
    """A fresh process imports every module of the package and runs a forward and backward
    (world size 1): no ``cake_kda*`` module ends up in ``sys.modules``."""
    code = (
        "import sys, torch, pkgutil, importlib\n"
        "import cake_gdn_det_train_kcp as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module('cake_gdn_det_train_kcp.' + m.name)\n"
        "from cake_gdn_det_train_kcp import *\n"
        "from cake_core.triton_utils import default_device\n"
        "dev = default_device()\n"
        "ctx = build_context_det_kcp(partition_det_kcp([0, 3], 1), None, 0, dev)\n"
        "x = [torch.rand(1, 3, 1, 16, device=dev) for _ in range(3)]\n"
        "gb = [torch.rand(1, 3, 1, device=dev) for _ in range(2)]\n"
        "o, s = chunk_gdn_det_fwd_kcp(*x, *gb, ctx)\n"
        "chunk_gdn_det_bwd_kcp(o, s, ctx)\n"
        "bad = sorted(m for m in sys.modules if m.startswith('cake_kda'))\n"
        "print('kda modules:', bad)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("kda modules: []"), r.stdout
