"""Write (or check) the legacy distributions under packages/ from the name registry.

    python3 shared/legacy_packages.py                  # every legacy dist whose target exists
    python3 shared/legacy_packages.py cake-mhc-train   # one (its canonical target must exist)
    python3 shared/legacy_packages.py --check          # exit 1 if a committed file differs

A legacy distribution holds only an import stub (``src/<old>/__init__.py`` calling
``cake_core.legacy.alias_legacy_module``), a ``.pyi`` re-exporting the canonical names and
binding their old spellings (its ``__all__`` is the runtime one), a ``<sub>.pyi`` per public
canonical submodule, ``py.typed``, a README and one tiny test file running
``cake_core.legacy_checks``. Its version is the canonical package's; it depends on the
canonical distribution(s) and cake-core with ``>=X.Y,<X.(Y+1)``. The ``.pyi`` lists the
canonical ``__all__`` read from the canonical ``__init__.py`` with ``ast`` (nothing is
imported: no torch needed). Adding a legacy name: record it in ``cake_core.names``, run
this script with the name, add its id to ``LEGACY`` in noxfile.py.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"


def load_names():
    """``cake_core.names`` loaded from its file alone (no torch, no cake_core package)."""
    path = PACKAGES / "cake-core" / "src" / "cake_core" / "names.py"
    spec = importlib.util.spec_from_file_location("_cake_names", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_cake_names"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def _canonical_init(import_name: str) -> Path:
    dist = import_name.replace("_", "-")
    return PACKAGES / dist / "src" / import_name / "__init__.py"


def canonical_api(import_name: str) -> tuple[str, list[str]]:
    """(``__version__``, ``__all__`` without ``__version__``) of a canonical package,
    read from its ``__init__.py`` source."""
    tree = ast.parse(_canonical_init(import_name).read_text())
    version, names = None, None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if getattr(t, "id", None) == "__version__":
                    version = ast.literal_eval(node.value)
                elif getattr(t, "id", None) == "__all__":
                    names = list(ast.literal_eval(node.value))
    if version is None or names is None:
        raise SystemExit(f"{import_name}: __init__.py lacks a literal __version__ or __all__")
    return version, [n for n in names if n != "__version__"]


def submodules(import_name: str) -> list[str]:
    """The public submodules (and subpackages) of a canonical package, from its files;
    ``cake_build`` (the build manifest) left out."""
    src = _canonical_init(import_name).parent
    out = [p.stem for p in src.glob("*.py")]
    out += [p.name for p in src.iterdir() if (p / "__init__.py").is_file()]
    return sorted(n for n in set(out) if not n.startswith("_") and n != "cake_build")


def _range(version: str) -> str:
    major, minor = (int(x) for x in version.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def _member_key(member: tuple[str, str]) -> tuple:
    """ruff's isort order of ``name as alias`` members: constants, classes, the rest;
    case-insensitive, digits compared as numbers."""
    name, alias = member
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2

    def natural(s: str) -> list:
        return [int(p) if p.isdigit() else p for p in re.split(r"(\\d+)", s.lower())]

    return kind, natural(name), natural(alias)


def render(old_dist: str, names) -> dict[str, str]:
    """Relative path -> text of every file of legacy distribution ``old_dist``."""
    targets = names.LEGACY[old_dist]
    old = old_dist.replace("-", "_")
    apis = [canonical_api(t.import_name) for t in targets]
    version = apis[0][0]
    core_version = canonical_api("cake_core")[0]
    new_imports = " and ".join(f"`{t.import_name}`" for t in targets)
    new_dists = " and ".join(f"`{t.dist}`" for t in targets)
    two = len(targets) == 2

    deps = [f'    "cake-core{_range(core_version)}",']
    deps += [f'    "{t.dist}{_range(v)}",' for t, (v, _) in zip(targets, apis, strict=True)]
    description = (f"Legacy name of {' and '.join(t.dist for t in targets)} (deprecated): "
                   f"import {old} resolves to the canonical objects.")
    pyproject = f'''[build-system]
requires = ["hatchling>=1.18"]
build-backend = "hatchling.build"

[project]
name = "{old_dist}"
dynamic = ["version"]
description = "{description}"
readme = "README.md"
requires-python = ">=3.10"
license = "Apache-2.0"
dependencies = [
{chr(10).join(deps)}
]

[project.optional-dependencies]
test = ["pytest>=7"]

[tool.hatch.version]
path = "src/{old}/__init__.py"

[tool.hatch.build.targets.wheel]
packages = ["src/{old}"]
'''

    if two:
        shape = (f"`{old}` is a re-export module: every public name of `{targets[0].import_name}`"
                 f" and of `{targets[1].import_name}` reads as the same object, `{old}.kcp` is "
                 f"`{targets[1].import_name}` itself and every other `{old}.<sub>` is "
                 f"`{targets[0].import_name}.<sub>` itself; setting `{old}.X` sets `X` on the "
                 "canonical module that owns it. The old module held the local and the KCP "
                 f"names, so it cannot be one canonical module: `{old} is not "
                 f"{targets[0].import_name}`, and `{old}.__name__` / `__version__` are the "
                 "stub's.")
    else:
        shape = (f"`import {old}` binds `{targets[0].import_name}` itself (`{old} is "
                 f"{targets[0].import_name}`), `import {old}.<sub>` binds "
                 f"`{targets[0].import_name}.<sub>` itself; module state is shared.")
    examples = []
    for t, (_, api) in zip(targets, apis, strict=True):
        for n in api:
            s = names.strip_det(n)
            if s != n:
                examples.append(f"`{s}` = `{t.import_name}.{n}`")
    readme = f"""# {old_dist} (legacy name, deprecated)

`{old_dist}` is the old name of {new_dists}. It holds only an import stub: new code imports
{new_imports}. Importing `{old}` raises one `DeprecationWarning` naming the new import.

{shape}

Every public name containing `_det` or `Det` also reads under its old spelling, as the same
object: {", ".join(examples)}. Writing, deleting or `mock.patch`-ing an old spelling acts
on the canonical name. `from {old} import *` binds the canonical names only (the runtime
and `.pyi` `__all__`); import an old spelling by name. Pickles written with old dotted
paths load. See `docs/training_backend_names.md` and `cake_core.legacy`.
"""

    lines = [f'"""{old_dist}: legacy name of {new_dists.replace("`", "")} (deprecated).', ""]
    if len(lines[0]) > 100:
        lines = [f'"""{old_dist}: legacy name (deprecated) of', "",
                 *(f"- {t.dist}" for t in targets), ""]
    lines += [f"Import {t.import_name} instead." for t in targets]
    lines += ["This stub resolves the old name to the canonical module"
              + ("s'" if two else "'s") + " own objects", "(cake_core.legacy).", '"""', "",
             f'__version__ = "{version}"', "",
             "import cake_core.legacy as _legacy  # noqa: E402", "",
             "_legacy.alias_legacy_module(__name__)", ""]
    init = "\n".join(lines)

    pyi = [f'"""Type stub of the legacy name {old}.', "",
           "``from " + old + " import *`` binds the names of the runtime ``__all__``: the",
           "canonical names" + (" and ``kcp``" if two else "") + ". Each old spelling is"
           " bound to its canonical name below",
           '(``from ' + old + ' import <old spelling>`` works); a star import does not bind it.',
           '"""', ""]
    exported: list[str] = []
    imports: list[str] = []
    olds: list[str] = []
    seen: set[str] = set()
    for t, (_, api) in zip(targets, apis, strict=True):
        # a name both modules export is the local module's at runtime (LegacyReExportModule)
        api = [n for n in api if n not in seen]
        seen.update(api)
        members = [(n, n) for n in api]
        if not two:
            members.append(("__version__", "__version__"))
        members.sort(key=_member_key)
        exported += [a for _, a in members]
        for n, a in members:
            line = f"from {t.import_name} import {n} as {a}"
            imports += [line] if len(line) <= 100 else [
                f"from {t.import_name} import (", f"    {n} as {a},", ")"]
        olds += [f"{names.strip_det(n)} = {n}" for _, n in
                 sorted(((names.strip_det(n), n) for n in api if names.strip_det(n) != n),
                        key=_member_key)]
    if two:
        pyi.append(f"import {targets[1].import_name} as kcp")
        exported.append("kcp")
    pyi += imports
    pyi.append("")
    if two:
        pyi += ["__version__: str", ""]
    pyi += ["# old spellings (the same objects; not in __all__)", *olds, ""]
    pyi.append("__all__ = [")
    pyi += [f'    "{n}",' for n in sorted(set(exported))]
    pyi.append("]")
    pyi.append("")

    subs = {}
    local = targets[0].import_name
    for sub in submodules(local):
        subs[f"src/{old}/{sub}.pyi"] = (
            f'"""Type stub of the legacy name {old}.{sub}:\n\n{local}.{sub} itself.\n"""\n\n'
            f"from {local}.{sub} import *  # noqa: F403\n")

    test = f'''"""{old_dist} (legacy name): the old import name gives the canonical objects."""

import pytest
from cake_core import legacy_checks

LEGACY = "{old}"


@pytest.mark.parametrize("check", legacy_checks.CHECKS, ids=lambda c: c.__name__)
def test_legacy_name(check):
    check(LEGACY)
'''
    return {
        "pyproject.toml": pyproject,
        "README.md": readme,
        f"src/{old}/__init__.py": init,
        f"src/{old}/__init__.pyi": "\n".join(pyi),
        f"src/{old}/py.typed": "",
        f"tests/test_{old}.py": test,
        **subs,
    }


def buildable(old_dist: str, names) -> bool:
    """True when every canonical target of ``old_dist`` exists under packages/."""
    return all(_canonical_init(t.import_name).is_file() for t in names.LEGACY[old_dist])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dists", nargs="*", help="legacy distribution names (default: all)")
    ap.add_argument("--check", action="store_true", help="report differences, write nothing")
    args = ap.parse_args(argv)
    names = load_names()
    dists = args.dists or [d for d in names.LEGACY if buildable(d, names)]
    bad = 0
    for dist in dists:
        if dist not in names.LEGACY:
            raise SystemExit(f"{dist}: not a legacy name in cake_core.names.LEGACY")
        if not buildable(dist, names):
            raise SystemExit(f"{dist}: a canonical target is missing under packages/")
        for rel, text in render(dist, names).items():
            path = PACKAGES / dist / rel
            if args.check:
                if not path.is_file() or path.read_text() != text:
                    print(f"stale: {path.relative_to(ROOT)}")
                    bad += 1
            elif not path.is_file() or path.read_text() != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote {path.relative_to(ROOT)}")
    if args.check and bad:
        print("run: python3 shared/legacy_packages.py")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

