"""The package imports no foreign cake family: only ``cake_core`` and its local sibling
``cake_causal_conv1d_det_train`` (as its pyproject declares). A scan of its sources for
static imports and for literal module names handed to ``importlib.import_module`` /
``__import__`` / ``importlib.util.find_spec``, with regression cases proving the scan
catches each form (the dynamic ones too); and a fresh process that imports and runs the
package loads no other ``cake_*`` module."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
ALLOWED = ("cake_core", "cake_causal_conv1d_det_train", "cake_causal_conv1d_det_train_kcp")
_DYNAMIC = {"import_module", "__import__", "find_spec"}


def foreign(name: object) -> bool:
    """Whether ``name`` is a ``cake_*`` module of another family (a dotted name's top
    package decides: ``cake_gdn_det_train.api`` is foreign, ``cake_core.kcp`` is not)."""
    if not isinstance(name, str):
        return False
    top = name.split(".")[0]
    return top.startswith("cake_") and top not in ALLOWED


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def scan(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every import of a foreign cake module in ``source``:
    ``import`` and ``from ... import`` statements (also inside functions and
    ``TYPE_CHECKING`` blocks; relative imports stay inside the package), and calls of
    ``import_module`` / ``__import__`` / ``find_spec`` (any spelling: ``importlib.``,
    ``builtins.``, a bare name) whose module argument (first positional or ``name=``) is
    a literal foreign name, or a relative literal whose ``package=`` (second positional
    or keyword) is."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            hits += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                     if foreign(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and foreign(node.module):
                hits.append(f"{filename}:{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if fname not in _DYNAMIC:
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = _literal(node.args[0]) if node.args else _literal(kw.get("name"))
            pkg = _literal(node.args[1]) if len(node.args) > 1 and fname != "__import__" \
                else _literal(kw.get("package"))
            if foreign(name) or (name and name.startswith(".") and foreign(pkg)):
                hits.append(f"{filename}:{node.lineno}: {fname}({name!r}, package={pkg!r})")
    return hits


def _sources():
    files = sorted((PKG / "src").rglob("*.py")) + sorted((PKG / "benchmarks").rglob("*.py"))
    assert len(files) >= 7, files
    return files


def test_sources_import_no_foreign_family():
    hits = [h for p in _sources() for h in scan(p.read_text(), str(p.relative_to(PKG)))]
    assert hits == []


@pytest.mark.parametrize("code", [
    "import cake_gdn_det_train",
    "import os, cake_kda_det_train.api as kda",
    "from cake_gdn_det_train_kcp import comm_bytes",
    "from cake_gdn_det_train_kcp.context import check_context",
    "def f():\n    from cake_rmsnorm_det_train import rmsnorm_det\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cake_kda_det_train_kcp\n",
    "import importlib\nm = importlib.import_module('cake_gdn_det_train_kcp')",
    "import importlib\nm = importlib.import_module(name='cake_kda_det_train.api')",
    "from importlib import import_module\nm = import_module('cake_tinylm')",
    "import importlib\nm = importlib.import_module('.api', package='cake_gdn_det_train')",
    "import importlib\nm = importlib.import_module('.context', 'cake_gdn_det_train_kcp')",
    "m = __import__('cake_dense_projection_det_gemm')",
    "m = __import__('cake_gdn_det_train.api', fromlist=['x'])",
    "import builtins\nm = builtins.__import__('cake_kda_det_train')",
    "import importlib.util\ns = importlib.util.find_spec('cake_gdn_det_train_kcp')",
])
def test_scan_catches(code):
    """Regression: each way of importing another family is found (dynamic imports too)."""
    assert len(scan(code)) == 1, (code, scan(code))


@pytest.mark.parametrize("code", [
    "import cake_causal_conv1d_det_train",
    "from cake_causal_conv1d_det_train.plan import MAX_HIDDEN",
    "from cake_core.kcp import build_context",
    "from . import api\nfrom .context import halo_plan",
    "import importlib\nm = importlib.import_module('cake_causal_conv1d_det_train_kcp.api')",
    "import importlib\nm = importlib.import_module('.api', package='cake_causal_conv1d_det_train')",
    "name = 'cake_gdn_det_train'  # a string, not an import",
    "m = __import__('cake_core')",
    "import cake_causal_conv1d_det_train_kcp.cake_build",
])
def test_scan_passes(code):
    assert scan(code) == []


def test_running_the_package_loads_no_foreign_family():
    """A fresh process imports every module of the package and runs a forward and backward
    (world size 1, a crossing partition): no other ``cake_*`` family is in ``sys.modules``."""
    code = (
        "import sys, torch, pkgutil, importlib\n"
        "import cake_causal_conv1d_det_train_kcp as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module('cake_causal_conv1d_det_train_kcp.' + m.name)\n"
        "pkg.cake_build.manifest()\n"
        "from cake_causal_conv1d_det_train_kcp import *\n"
        "from cake_core.triton_utils import default_device\n"
        "dev = default_device()\n"
        "p = partition_det_kcp([0, 6], 1, fragments=[(0, 0, 3, 3), (0, 0, 0, 3)])\n"
        "ctx = build_context_det_kcp(p, None, 0, dev, 3)\n"
        "x = torch.rand(1, 6, 4, device=dev)\n"
        "w = torch.rand(4, 3, device=dev)\n"
        "y, s = causal_conv1d_det_fwd_kcp(x, w, None, ctx, activation='silu')\n"
        "causal_conv1d_det_bwd_kcp(y, s, ctx, reduce_weight_grads=True)\n"
        "top = {m.split('.')[0] for m in sys.modules if m.startswith('cake_')}\n"
        "print('cake packages:', sorted(top))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = r.stdout.strip().splitlines()[-1]
    assert line == "cake packages: ['cake_causal_conv1d_det_train', " \
                   "'cake_causal_conv1d_det_train_kcp', 'cake_core']", r.stdout
