"""The package imports no other family: only ``cake_core``, its local sibling
``cake_kda_det_train`` and itself. A scan of its sources (and its benchmark) for static
imports and for literal module names handed to ``importlib.import_module`` /
``__import__``, with regression cases proving the scan catches each form (a dynamic
import of GDN's package included); and a fresh process that imports and runs the package
loads no foreign ``cake_*`` module."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
ALLOWED = {"cake_core", "cake_kda_det_train", "cake_kda_det_train_kcp"}
_DYNAMIC = {"import_module", "__import__"}


def _foreign(name: object) -> bool:
    """A ``cake_*`` module outside :data:`ALLOWED` (by its top-level package name)."""
    if not isinstance(name, str):
        return False
    top = name.lstrip(".").split(".")[0]
    return top.startswith("cake_") and top not in ALLOWED


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def scan(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every import of a foreign ``cake_*`` module in ``source``:
    ``import`` and ``from ... import`` statements (also inside functions and
    ``TYPE_CHECKING`` blocks), and calls of ``importlib.import_module`` / ``import_module``
    / ``__import__`` (any receiver) whose module argument (first positional or ``name=``)
    or ``package=`` is a literal naming one."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            hits += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                     if _foreign(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _foreign(node.module or ""):
                hits.append(f"{filename}:{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if fname not in _DYNAMIC:
                continue
            args = list(node.args[:1]) + [k.value for k in node.keywords
                                          if k.arg in ("name", "package")]
            for a in args:
                lit = _literal(a)
                if _foreign(lit):
                    hits.append(f"{filename}:{node.lineno}: {fname}({lit!r})")
    return hits


def _sources():
    files = sorted((PKG / "src").rglob("*.py")) + sorted((PKG / "benchmarks").rglob("*.py"))
    assert len(files) >= 7, files
    return files


def test_sources_import_no_foreign_family():
    hits = [h for p in _sources() for h in scan(p.read_text(), str(p.relative_to(PKG)))]
    assert hits == []


def test_sources_import_the_sibling():
    """The scan looks at real imports: the sources do import the local sibling."""
    text = (PKG / "src" / "cake_kda_det_train_kcp" / "api.py").read_text()
    assert "from cake_kda_det_train import" in text


@pytest.mark.parametrize("code", [
    "import cake_gdn_det_train",
    "import os, cake_gdn_det_train.api as gdn",
    "from cake_gdn_det_train import chunk_gdn_det_fwd",
    "from cake_gdn_det_train_kcp.exchange import fold_forward",
    "from cake_causal_conv1d_det_train_kcp import x",
    "def f():\n    from cake_gdn_det_train_kcp import x\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cake_gdn_det_train\n",
    "import importlib\nm = importlib.import_module('cake_gdn_det_train')",
    "import importlib\nm = importlib.import_module(name='cake_gdn_det_train.api')",
    "from importlib import import_module\nm = import_module('cake_gdn_det_train_kcp')",
    "import importlib\nm = importlib.import_module('.api', package='cake_gdn_det_train')",
    "m = __import__('cake_gdn_det_train')",
    "m = __import__('cake_tinylm.model', fromlist=['x'])",
    "import builtins\nm = builtins.__import__('cake_rmsnorm_det_train')",
])
def test_scan_catches(code):
    """Regression: each way of importing a foreign family's module is found (dynamic
    imports too)."""
    assert len(scan(code)) == 1, (code, scan(code))


@pytest.mark.parametrize("code", [
    "import cake_kda_det_train",
    "from cake_kda_det_train.plan import MAX_HEAD_DIM",
    "import importlib\nm = importlib.import_module('cake_kda_det_train_kcp.api')",
    "from cake_core.kcp import Context",
    "name = 'cake_gdn_det_train'  # a string, not an import",
    "m = __import__('cake_core')",
    "from .context import LocalGroup",
])
def test_scan_passes(code):
    assert scan(code) == []


def test_running_the_package_loads_no_foreign_family():
    """A fresh process imports every module of the package and runs a forward and backward
    (world size 1, the in-kernel gate): no foreign ``cake_*`` module ends up in
    ``sys.modules``."""
    code = (
        "import sys, torch, pkgutil, importlib\n"
        "import cake_kda_det_train_kcp as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module('cake_kda_det_train_kcp.' + m.name)\n"
        "from cake_kda_det_train_kcp import *\n"
        "from cake_kda_det_train_kcp.cake_build import manifest\n"
        "from cake_core.triton_utils import default_device\n"
        "manifest()\n"
        "dev = default_device()\n"
        "ctx = build_context_det_kcp(partition_det_kcp([0, 3], 1), None, 0, dev)\n"
        "x = [torch.rand(1, 3, 1, 16, device=dev) for _ in range(4)]\n"
        "b = torch.rand(1, 3, 1, device=dev)\n"
        "o, s = chunk_kda_det_fwd_kcp(*x, b, ctx, use_gate_in_kernel=True,\n"
        "                             A_log=torch.zeros(1, device=dev))\n"
        "chunk_kda_det_bwd_kcp(o, s, ctx)\n"
        "allowed = " + repr(sorted(ALLOWED)) + "\n"
        "bad = sorted(m for m in sys.modules if m.startswith('cake_')\n"
        "             and m.split('.')[0] not in allowed)\n"
        "print('foreign modules:', bad)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("foreign modules: []"), r.stdout
