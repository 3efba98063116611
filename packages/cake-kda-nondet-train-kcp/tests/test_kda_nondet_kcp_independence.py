"""The package imports no other family: only ``cake_core``, its siblings
``cake_kda_det_train``, ``cake_kda_det_train_kcp`` and ``cake_kda_nondet_train``, and
itself (no GDN, no other family). A scan of its sources and of cake-kda-nondet-train's for
static imports and for literal module names handed to ``importlib.import_module`` /
``__import__``; the det KDA packages import neither nondet package (det never depends on
nondet); and a fresh process that imports and runs the package loads no foreign
``cake_*`` module."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
ALLOWED = {"cake_core", "cake_kda_det_train", "cake_kda_det_train_kcp", "cake_kda_nondet_train",
           "cake_kda_nondet_train_kcp"}
_DYNAMIC = {"import_module", "__import__"}


def _foreign(name: object, allowed) -> bool:
    """A ``cake_*`` module outside ``allowed`` (by its top-level package name)."""
    if not isinstance(name, str):
        return False
    top = name.lstrip(".").split(".")[0]
    return top.startswith("cake_") and top not in allowed


def scan(source: str, filename: str = "<source>", allowed=ALLOWED) -> list[str]:
    """``file:line: what`` for every import of a ``cake_*`` module outside ``allowed``:
    ``import`` / ``from ... import`` statements (anywhere, ``TYPE_CHECKING`` blocks too)
    and ``import_module`` / ``__import__`` calls (any receiver) whose module argument
    (first positional or ``name=``) or ``package=`` is a literal naming one."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            hits += [f"{filename}:{node.lineno}: import {a.name}" for a in node.names
                     if _foreign(a.name, allowed)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _foreign(node.module or "", allowed):
                hits.append(f"{filename}:{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if fname not in _DYNAMIC:
                continue
            args = list(node.args[:1]) + [k.value for k in node.keywords
                                          if k.arg in ("name", "package")]
            for a in args:
                lit = a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) \
                    else None
                if _foreign(lit, allowed):
                    hits.append(f"{filename}:{node.lineno}: {fname}({lit!r})")
    return hits


def _package_dir(name: str) -> Path:
    import importlib.util

    return Path(importlib.util.find_spec(name).origin).parent


def _hits(root: Path, allowed) -> list[str]:
    files = sorted(root.rglob("*.py"))
    assert files, root
    return [h for p in files for h in scan(p.read_text(), str(p), allowed)]


def test_sources_import_no_foreign_family():
    assert _hits(PKG / "src", ALLOWED) == []
    local = ALLOWED - {"cake_kda_det_train_kcp", "cake_kda_nondet_train_kcp"}
    assert _hits(_package_dir("cake_kda_nondet_train"), local) == []


def test_det_packages_import_no_nondet_package():
    """Every cake import of the det KDA packages (their layers extra's families included)
    names no ``nondet`` package."""
    for name in ("cake_kda_det_train", "cake_kda_det_train_kcp"):
        hits = _hits(_package_dir(name), {"cake_core"})  # every other cake_* import
        assert any(name in h.split(":", 2)[2] for h in hits), name  # it sees their imports
        assert [h for h in hits if "nondet" in h.split(":", 2)[2]] == [], name


@pytest.mark.parametrize("code", [
    "import cake_gdn_det_train",
    "from cake_gdn_nondet_train import chunk_gdn_nondet_fwd",
    "from cake_gdn_det_train_kcp.exchange import fold_forward",
    "def f():\n    from cake_gdn_nondet_train_kcp import x\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import cake_gdn_det_train\n",
    "import importlib\nm = importlib.import_module('cake_gdn_nondet_train')",
    "import importlib\nm = importlib.import_module('.api', package='cake_gdn_det_train')",
    "m = __import__('cake_rmsnorm_det_train')",
])
def test_scan_catches(code):
    assert len(scan(code)) == 1, (code, scan(code))


@pytest.mark.parametrize("code", [
    "import cake_kda_nondet_train",
    "from cake_kda_det_train_kcp.api import KCPKinds",
    "import importlib\nm = importlib.import_module('cake_kda_nondet_train_kcp.api')",
    "name = 'cake_gdn_det_train'  # a string, not an import",
    "from .context import x",
])
def test_scan_passes(code):
    assert scan(code) == []


def test_running_the_package_loads_no_foreign_family():
    """A fresh process imports every module of the package and runs a forward and backward
    (world size 1, the in-kernel gate): no foreign ``cake_*`` module in ``sys.modules``."""
    code = (
        "import sys, torch, pkgutil, importlib\n"
        "import cake_kda_nondet_train_kcp as pkg\n"
        "for m in pkgutil.iter_modules(pkg.__path__):\n"
        "    importlib.import_module('cake_kda_nondet_train_kcp.' + m.name)\n"
        "from cake_kda_nondet_train_kcp import *\n"
        "from cake_kda_nondet_train_kcp.cake_build import manifest\n"
        "from cake_core.triton_utils import default_device\n"
        "manifest()\n"
        "dev = default_device()\n"
        "ctx = build_context_nondet_kcp(partition_nondet_kcp([0, 3], 1), None, 0, dev)\n"
        "x = [torch.rand(1, 3, 1, 16, device=dev) for _ in range(4)]\n"
        "b = torch.rand(1, 3, 1, device=dev)\n"
        "o, s = chunk_kda_nondet_fwd_kcp(*x, b, ctx, use_gate_in_kernel=True,\n"
        "                                A_log=torch.zeros(1, device=dev))\n"
        "chunk_kda_nondet_bwd_kcp(o, s, ctx)\n"
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
