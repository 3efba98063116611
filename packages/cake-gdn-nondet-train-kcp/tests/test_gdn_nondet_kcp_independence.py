"""Neither GDN nondet package imports a ``cake_kda*`` module: cake-gdn-det-train-kcp's
source scan (static imports and literal module names handed to ``importlib.import_module``
/ ``__import__``; its regression cases live with it) over both packages' sources, and a
fresh process that imports and runs this package loads none."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
PACKAGES = PKG.parent
_SCAN_FILE = PACKAGES / "cake-gdn-det-train-kcp" / "tests" / "test_gdn_kcp_independence.py"


def _scan():
    if not _SCAN_FILE.is_file():
        pytest.skip("needs the repository's packages/ folder (the det KCP package's scan)")
    spec = importlib.util.spec_from_file_location("_gdn_kcp_independence_scan", _SCAN_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.scan


@pytest.mark.parametrize("dist", ["cake-gdn-nondet-train", "cake-gdn-nondet-train-kcp"])
def test_sources_import_no_kda_module(dist):
    scan = _scan()
    root = PACKAGES / dist
    files = sorted((root / "src").rglob("*.py"))
    assert len(files) >= 5, files
    hits = [h for p in files for h in scan(p.read_text(), str(p.relative_to(root)))]
    assert hits == []
    assert scan("import importlib\nm = importlib.import_module('cake_kda_det_train')")


def test_running_the_package_loads_no_kda_module():
    """A fresh process imports every module of both nondet packages and runs a KCP forward
    and backward (world size 1): no ``cake_kda*`` module ends up in ``sys.modules``."""
    code = (
        "import sys, torch, pkgutil, importlib\n"
        "import cake_gdn_nondet_train, cake_gdn_nondet_train_kcp\n"
        "for pkg in (cake_gdn_nondet_train, cake_gdn_nondet_train_kcp):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(pkg.__name__ + '.' + m.name)\n"
        "from cake_gdn_nondet_train_kcp import *\n"
        "from cake_core.triton_utils import default_device\n"
        "dev = default_device()\n"
        "ctx = build_context_nondet_kcp(partition_nondet_kcp([0, 3], 1), None, 0, dev)\n"
        "x = [torch.rand(1, 3, 1, 16, device=dev) for _ in range(3)]\n"
        "gb = [torch.rand(1, 3, 1, device=dev) for _ in range(2)]\n"
        "o, s = chunk_gdn_nondet_fwd_kcp(*x, *gb, ctx)\n"
        "chunk_gdn_nondet_bwd_kcp(o, s, ctx)\n"
        "bad = sorted(m for m in sys.modules if m.startswith('cake_kda'))\n"
        "print('kda modules:', bad)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("kda modules: []"), r.stdout
