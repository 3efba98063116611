"""Every package admits only the torch and Triton that were tested, and the same ones.

cake-core's pyproject.toml holds the ranges (its README says which versions were tested:
torch 2.13.0 with Triton 3.6.0 in CI on the CPU, torch 2.11 with Triton 3.6 on the H200);
every other package that names torch or Triton declares exactly cake-core's ranges, and CI's
pins (noxfile.py's BASE) lie inside them, its numpy range being cake-core's ``interpreter``
extra."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "packages"

#: packages whose ranges another branch updates; each must still differ, so that this set
#: is emptied once they follow cake-core
PENDING: set[str] = set()


def _meta(dist: str) -> dict:
    return tomllib.loads((PACKAGES / dist / "pyproject.toml").read_text())["project"]


def _ranges(meta: dict) -> dict[str, str]:
    out = {}
    for d in meta.get("dependencies", []):
        req = Requirement(d)
        if req.name in ("torch", "triton", "numpy"):
            out[req.name] = str(req.specifier)
    return out


def _base() -> list[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "BASE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py has no BASE = [...]")


def test_every_package_declares_cake_cores_ranges():
    core = _ranges(_meta("cake-core"))
    assert set(core) == {"torch", "triton"}, core
    differ = set()
    for d in sorted(p.name for p in PACKAGES.iterdir() if (p / "pyproject.toml").is_file()):
        got = _ranges(_meta(d))
        if got and got != core:
            differ.add(d)
    assert differ == PENDING & differ, f"ranges other than cake-core's {core}: {differ}"
    assert PENDING <= differ, f"{PENDING - differ} follow cake-core now: drop from PENDING"


def test_ci_pins_lie_inside_the_ranges():
    meta = _meta("cake-core")
    core = {Requirement(d).name: Requirement(d).specifier for d in meta["dependencies"]}
    base = {Requirement(b).name: Requirement(b) for b in _base()}
    for name in ("torch", "triton"):
        pin = base[name].specifier
        assert len(pin) == 1 and next(iter(pin)).operator == "==", pin
        assert core[name].contains(next(iter(pin)).version), (name, pin, core[name])
    extra = [Requirement(d) for d in meta["optional-dependencies"]["interpreter"]]
    assert [(r.name, r.specifier) for r in extra] == [("numpy", base["numpy"].specifier)]
