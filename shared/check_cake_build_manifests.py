#!/usr/bin/env python3
"""Check, or regenerate, every cake package's build manifest and built distributions.

    python3 shared/check_cake_build_manifests.py              # every package under packages/
    python3 shared/check_cake_build_manifests.py --write      # regenerate the generated blocks
    python3 shared/check_cake_build_manifests.py --init packages/cake-new-det-train  # create
    python3 shared/check_cake_build_manifests.py packages/cake-rmsnorm-det-train --no-build
    nox -s manifests                                           # the check, then its own tests

For each package it builds the sdist, then the wheel from the unpacked sdist (the package's
PEP 517 backend called directly, or ``--builder build`` for ``python -m build``), and
reports findings (one line each, exit status 1 when there is any):

  build            the sdist or the wheel does not build
  wheel-missing    a file of ``src/<import_name>/`` is not in the wheel
  wheel-extra      a file in the wheel is not in the source tree
  manifest         ``cake_build.py`` missing, broken, disagreeing with pyproject.toml, or
                   naming an entry point its package does not export
  kernel-unlisted  an ``@triton.jit`` function of the sources is not in ``KERNELS``
  kernel-missing   a listed kernel is not an ``@triton.jit`` function of its module
  digest-stale     ``SOURCE_DIGEST`` differs from the digest of the sources: every module
                   of the package but ``cake_build.py``, the modules of its listed kernels
                   and of the ``@triton.jit`` functions they call, transitively, and
                   ``DIGEST_EXTRA`` (:func:`digest_modules`)
  plans-stale      ``PLANS`` differs from the plan classes found in the sources
  package-data     ``PACKAGE_DATA`` differs from the package's non-``.py`` files
  sibling-kernel   a KCP sibling registry names a kernel, entry point or package that the
                   sibling does not have
  sibling-version  a KCP sibling registry's version range excludes the sibling's version or
                   differs from the range pyproject.toml pins
  dependency-version
                   a dependency on a cake-* package of this monorepo (``dependencies`` or
                   an extra) whose range excludes that package's current version
  requires-python  no ``requires-python`` in pyproject.toml or the wheel's metadata
  version-mismatch the version file, the sdist / wheel metadata and ``FAMILY`` disagree
  name-unknown     a name the registry (``cake_core/names.py``) does not know, or one
                   that disagrees with its entry

It needs neither torch nor Triton nor a GPU: sources are read with ``ast``, each
``cake_build.py`` is plain data (run from its file), the registry is loaded from its file
alone. Needs ``packaging`` and the build backend (``hatchling``) importable.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import email.parser
import importlib.util
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ModuleNotFoundError:  # pragma: no cover - a bare interpreter
    sys.exit("check_cake_build_manifests.py needs packaging (and hatchling to build): "
             "pip install packaging hatchling, or run nox -s manifests")

ROOT = Path(__file__).resolve().parents[1]

KINDS = ("build", "wheel-missing", "wheel-extra", "manifest", "kernel-unlisted",
         "kernel-missing", "digest-stale", "plans-stale", "package-data", "sibling-kernel",
         "sibling-version", "dependency-version", "requires-python", "version-mismatch",
         "name-unknown")

#: registry kind -> the kind a ``cake_build.FAMILY`` declares (cake_core.families: "local",
#: "kcp" or "tool" for what is not a kernel family)
FAMILY_KIND = {"core": "tool", "job": "tool", "integration": "tool"}

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclasses.dataclass(frozen=True)
class Finding:
    package: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.package}: {self.kind}: {self.detail}"


# ---------------------------------------------------------------------------- loading


def _load_file_module(path: Path, name: str):
    """Import one standard-library-only module from its file (no package __init__ runs)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve their module while the body runs
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    return mod


@dataclasses.dataclass
class Package:
    path: Path
    pyproject: dict
    dist: str
    import_name: str
    version_file: Path | None

    @property
    def src(self) -> Path:
        return self.path / "src" / self.import_name

    @property
    def manifest_file(self) -> Path:
        return self.src / "cake_build.py"


def load_package(path: Path) -> Package:
    meta = tomllib.loads((path / "pyproject.toml").read_text())
    dist = meta["project"]["name"]
    pkgs = (meta.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {})
            .get("wheel", {}).get("packages", []))
    import_name = Path(pkgs[0]).name if pkgs else dist.replace("-", "_")
    vpath = meta.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    return Package(path=path, pyproject=meta, dist=dist, import_name=import_name,
                   version_file=path / vpath if vpath else None)


def read_version_file(pkg: Package) -> str | None:
    if pkg.version_file is None or not pkg.version_file.is_file():
        return None
    m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", pkg.version_file.read_text(),
                  re.M)
    return m[1] if m else None


def load_manifest_module(pkg: Package) -> dict:
    """The globals of ``cake_build.py`` (plain data: run from its file)."""
    return runpy.run_path(str(pkg.manifest_file), run_name=f"{pkg.import_name}.cake_build")


class Registry:
    """The name registry, ``cake_core/names.py``, loaded from its file alone."""

    def __init__(self, path: Path):
        self.path = path
        self.mod = _load_file_module(path, "_cake_names_registry") if path.is_file() else None

    def entry(self, dist: str):
        return self.mod.by_dist(dist)

    def is_legacy(self, dist: str) -> bool:
        return self.mod is not None and dist in self.mod.LEGACY

    def knows_import(self, name: str) -> bool:
        if self.mod is None:
            return False
        try:
            self.mod.by_import(name)
            return True
        except KeyError:
            return any(name == old.replace("-", "_") for old in self.mod.LEGACY)


# ---------------------------------------------------------------------------- sources


def source_files(src: Path) -> list[str]:
    """Files of a package's source tree, relative to ``src`` (posix), caches skipped. In
    a git work tree, files git ignores are skipped too."""
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for f in sorted(filenames):
            if not f.endswith(_SKIP_SUFFIXES):
                out.append((Path(dirpath) / f).relative_to(src).as_posix())
    try:
        r = subprocess.run(["git", "-C", str(src), "ls-files", "-oi", "--exclude-standard",
                            "--directory", "."], capture_output=True, text=True, timeout=30)
        ignored = r.stdout.split() if r.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        ignored = []
    if ignored:
        out = [f for f in out if not any(f == i or f.startswith(i.rstrip("/") + "/")
                                         for i in ignored)]
    return sorted(out)


def module_name(import_name: str, rel: str) -> str:
    parts = [import_name, *Path(rel).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _jit_aliases(tree: ast.Module) -> set[str]:
    """Names a module binds to ``triton.jit``: ``jit`` itself, ``from triton import jit as
    _jit`` and ``_jit = triton.jit``."""
    out = {"jit"}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "triton":
            out |= {a.asname or a.name for a in n.names if a.name == "jit"}
        elif (isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
              and n.value.attr == "jit"):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def _is_jit(dec: ast.expr, aliases: set[str] = frozenset({"jit"})) -> bool:
    """``dec`` is ``triton.jit``, ``<alias of triton.jit>``, or a call of either."""
    if isinstance(dec, ast.Call):
        dec = dec.func
    return ((isinstance(dec, ast.Attribute) and dec.attr == "jit")
            or (isinstance(dec, ast.Name) and dec.id in aliases))


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return None


def module_jits(tree: ast.Module | None) -> dict[str, ast.FunctionDef]:
    """Module-level ``@triton.jit`` functions of a parsed module, in source order: name ->
    the function whose body is compiled. Counts ``@triton.jit`` / ``@triton.jit(...)`` /
    ``@<alias>`` decorators and ``name = triton.jit(fn)`` (or ``triton.jit(...)(fn)``,
    ``<alias>(fn)``) of a module-level ``fn``."""
    if tree is None:
        return {}
    aliases = _jit_aliases(tree)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    out: dict[str, ast.FunctionDef] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef) and any(_is_jit(d, aliases)
                                                  for d in n.decorator_list):
            out[n.name] = n
        elif (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
              and _is_jit(n.value.func, aliases) and n.value.args
              and isinstance(n.value.args[0], ast.Name) and n.value.args[0].id in defs):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = defs[n.value.args[0].id]
    return out


def jit_functions(path: Path) -> list[str]:
    """Module-level ``@triton.jit`` functions of a file, in source order (see
    :func:`module_jits`)."""
    return list(module_jits(_parse(path)))


def _imported_plan(tree: ast.Module, name: str, path: Path) -> list[str] | None:
    """The fields of plan class ``name`` when the file imports it from another cake package
    (``from cake_x.plan import XPlan``), read from that package's source; else None."""
    for n in tree.body:
        if not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("cake_")
                and any((a.asname or a.name) == name for a in n.names)):
            continue
        real = next(a.name for a in n.names if (a.asname or a.name) == name)
        packages = next((p for p in path.parents if p.name == "packages"), None)
        if packages is None:
            return None
        rel = Path(*n.module.split("."))
        for src in sorted(packages.glob("*/src")):
            for f in (src / rel.with_suffix(".py"), src / rel / "__init__.py"):
                if f.is_file():
                    found = {c["class"]: c for c in plan_classes(f, n.module, set())}
                    if real in found:
                        return found[real]["fields"]
    return None


def plan_classes(path: Path, mod: str, known: set[str]) -> list[dict]:
    """Plan classes of a file: classes deriving from cake_core's ``Plan``, from a plan
    class already found, or from a plan class another cake package defines (a nondet
    sibling's plan over its det sibling's), with their format version and dataclass fields
    (inherited ones first)."""
    tree = _parse(path)
    out = []
    for n in tree.body if tree else []:
        if not isinstance(n, ast.ClassDef):
            continue
        bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                 for b in n.bases}
        inherited: list[str] = []
        if not ({"Plan"} | known) & bases:
            outside = [_imported_plan(tree, b, path) for b in sorted(bases - {None})
                       if b.endswith("Plan")]
            outside = [f for f in outside if f is not None]
            if not outside:
                continue
            inherited = outside[0]
        fields, version = [], None
        for s in n.body:
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                if "ClassVar" in ast.unparse(s.annotation):
                    if s.target.id == "format_version" and isinstance(s.value, ast.Constant):
                        version = s.value.value
                    continue
                fields.append(s.target.id)
        fields = inherited + [f for f in fields if f not in inherited]
        known.add(n.name)
        out.append({"module": mod, "class": n.name, "format_version": version,
                    "fields": fields})
    return out


def public_names(init: Path) -> set[str] | None:
    """``__all__`` of a package ``__init__.py`` (literal), or None."""
    tree = _parse(init)
    for n in tree.body if tree else []:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                             for t in n.targets):
            try:
                return set(ast.literal_eval(n.value))
            except ValueError:
                return None
    return None


class Tree:
    """Every package of the monorepo (and the packages being checked, which take precedence),
    with module lookup by import name."""

    def __init__(self, root: Path, extra: list[Package] = ()):
        self.root = root
        self.by_dist: dict[str, Package] = {}
        for p in sorted((root / "packages").glob("*/pyproject.toml")):
            pkg = load_package(p.parent)
            self.by_dist[pkg.dist] = pkg
        for pkg in extra:
            self.by_dist[pkg.dist] = pkg
        self.by_import = {p.import_name: p for p in self.by_dist.values()}
        core = self.by_dist.get("cake-core")
        self.core_src = core.src if core else root / "packages/cake-core/src/cake_core"
        self.registry = Registry(self.core_src / "names.py")
        self._build = None
        self._info: dict = {}

    @property
    def build_mod(self):
        if self._build is None:
            self._build = _load_file_module(self.core_src / "build.py", "_cake_core_build")
        return self._build

    def module_info(self, module: str):
        """(:func:`module_jits`, :func:`_imports`) of a module under ``packages/``, or
        None (cached)."""
        if module not in self._info:
            f = self.module_file(module)
            t = _parse(f) if f is not None else None
            self._info[module] = None if t is None else (
                module_jits(t), _imports(t, module, f.name == "__init__.py"))
        return self._info[module]

    def module_file(self, module: str) -> Path | None:
        top, *rest = module.split(".")
        pkg = self.by_import.get(top)
        if pkg is None:
            return None
        base = pkg.src.joinpath(*rest)
        for cand in (base.with_suffix(".py") if rest else None, base / "__init__.py"):
            if cand is not None and cand.is_file():
                return cand
        return None


def _imports(tree: ast.Module, module: str, is_pkg: bool) -> dict[str, tuple[str, str | None]]:
    """Local name -> (module, attribute or None for the module itself) for every import of
    a module (relative imports resolved against ``module``)."""
    out: dict[str, tuple[str, str | None]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname:
                    out[a.asname] = (a.name, None)
                else:
                    top = a.name.split(".")[0]
                    out[top] = (top, None)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = module.split(".")
                keep = len(parts) - n.level + (1 if is_pkg else 0)
                base = ".".join(parts[:max(keep, 0)] + ([base] if base else []))
            for a in n.names:
                if a.name != "*":
                    out[a.asname or a.name] = (base, a.name)
    return out


def _dotted(e: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(e, ast.Attribute):
        parts.append(e.attr)
        e = e.value
    if not isinstance(e, ast.Name):
        return None
    return [e.id, *reversed(parts)]


def reached_kernels(tree: Tree, kernels: list[dict]) -> list[tuple[str, str]]:
    """The ``@triton.jit`` functions ``kernels`` call, transitively, across the monorepo's
    packages: (module, function) pairs, the listed kernels first. Read with ``ast``: a call
    inside a jitted function to a name (``dot(...)``, ``tu.dot(...)``,
    ``cake_core.triton_utils.dot(...)``) that resolves, through the module's imports and
    re-exports, to a jitted function of a module under ``packages/``."""
    seen: list[tuple[str, str]] = []
    todo = [(str(k.get("module")), str(k.get("function"))) for k in kernels
            if isinstance(k, dict)]
    while todo:
        key = todo.pop(0)
        if key in seen:
            continue
        info = tree.module_info(key[0])
        if info is None or key[1] not in info[0]:
            continue
        seen.append(key)
        for n in ast.walk(info[0][key[1]]):
            if isinstance(n, ast.Call):
                hit = _resolve_call(tree, key[0], _dotted(n.func))
                if hit is not None and hit not in seen:
                    todo.append(hit)
    return seen


def _resolve_call(tree: Tree, module: str, dotted: list[str] | None,
                  depth: int = 0) -> tuple[str, str] | None:
    """The jitted (module, function) that ``dotted`` names inside ``module``, or None."""
    info = tree.module_info(module)
    if dotted is None or info is None or depth > 8:
        return None
    jits, imports = info
    head, *rest = dotted
    if not rest:
        if head in jits:
            return module, head
        if head in imports and imports[head][1] is not None:
            base, attr = imports[head]
            return _resolve_call(tree, base, [attr], depth + 1)
        return None
    if head not in imports:
        return None
    base, attr = imports[head]
    mod = base if attr is None else f"{base}.{attr}"
    *path, fn = rest
    mod = ".".join([mod, *path])
    return _resolve_call(tree, mod, [fn], depth + 1) if tree.module_file(mod) else None


# ---------------------------------------------------------------------------- expected


def own_kernels(pkg: Package) -> list[dict]:
    out = []
    for rel in source_files(pkg.src):
        if rel.endswith(".py"):
            mod = module_name(pkg.import_name, rel)
            out += [{"module": mod, "function": f} for f in jit_functions(pkg.src / rel)]
    return out


def own_plans(pkg: Package) -> list[dict]:
    known: set[str] = set()
    out = []
    for _ in range(2):  # a second pass finds subclasses defined in an earlier module
        out = []
        for rel in source_files(pkg.src):
            if rel.endswith(".py") and rel != "cake_build.py":
                out += plan_classes(pkg.src / rel, module_name(pkg.import_name, rel), known)
    return out


def package_data(pkg: Package) -> list[str]:
    return [f for f in source_files(pkg.src) if not f.endswith(".py")]


def digest_modules(tree: Tree, pkg: Package, kernels: list[dict],
                   extra: list[str]) -> dict[str, Path]:
    """Module name -> file of every module ``SOURCE_DIGEST`` covers (the rule, also in
    docs/releasing.md): every ``.py`` module of the package's own source tree but
    ``cake_build.py``; the module of every listed kernel (own, ``SHARED_KERNELS``,
    reused); the module of every ``@triton.jit`` function those kernels call,
    transitively (:func:`reached_kernels`); and the ``DIGEST_EXTRA`` modules."""
    out = {module_name(pkg.import_name, rel): pkg.src / rel for rel in source_files(pkg.src)
           if rel.endswith(".py") and rel != "cake_build.py"}
    mods = {m for m, _ in reached_kernels(tree, kernels)}
    mods |= {str(k.get("module")) for k in kernels if isinstance(k, dict)} | set(extra)
    for mod in sorted(mods - set(out)):
        f = tree.module_file(mod)
        if f is not None:
            out[mod] = f
    return dict(sorted(out.items()))


def compute_digest(tree: Tree, pkg: Package, kernels: list[dict], extra: list[str]) -> str:
    return tree.build_mod.digest_sources(
        (mod, f.read_bytes()) for mod, f in digest_modules(tree, pkg, kernels, extra).items())


def expected_generated(tree: Tree, pkg: Package, g: dict) -> dict:
    """The generated block's values as the sources say they should be. ``g``: the current
    globals of ``cake_build.py`` (hand-kept ``SHARED_KERNELS``, ``REUSES``,
    ``DIGEST_EXTRA``)."""
    kernels = own_kernels(pkg)
    plans = own_plans(pkg)
    reused: dict[str, list[dict]] = {}
    for r in g.get("REUSES", []):
        sib = tree.by_dist.get(r.get("name"))
        if sib is None or not sib.manifest_file.is_file():
            continue
        try:
            sg = load_manifest_module(sib)
            reused[sib.dist] = [dict(k) for k in sg["MANIFEST"]["kernels"]]
            plans += [p for p in sg["MANIFEST"]["plans"] if p not in plans]
        except Exception:  # noqa: BLE001 - reported by the sibling's own check
            continue
    all_k = kernels + list(g.get("SHARED_KERNELS", []))
    for ks in reused.values():
        all_k += ks
    out = {"KERNELS": kernels, "PLANS": plans, "PACKAGE_DATA": package_data(pkg)}
    if g.get("REUSES"):
        out["REUSED_KERNELS"] = reused
    out["SOURCE_DIGEST"] = compute_digest(tree, pkg, all_k, list(g.get("DIGEST_EXTRA", [])))
    return out


# ---------------------------------------------------------------------------- rendering


def _r(v, col: int, ind: int = 0) -> str:
    """A literal for ``v`` (dicts, lists, str, int, None) that starts at column ``col`` of a
    line indented by ``ind``, wrapped under 100 columns (continuations aligned under the
    opening bracket; a list of dicts one dict a line)."""
    if isinstance(v, str):
        return json.dumps(v)
    if not isinstance(v, (list, dict)) or not v:
        return repr(v) if not isinstance(v, (list, dict)) else ("[]" if isinstance(v, list)
                                                               else "{}")
    if isinstance(v, list) and all(isinstance(x, dict) for x in v):
        inner = " " * (ind + 4)
        return ("[\n" + "".join(f"{inner}{_r(x, ind + 4, ind + 4)},\n" for x in v)
                + " " * ind + "]")
    o, c = ("{", "}") if isinstance(v, dict) else ("[", "]")
    items = ([(json.dumps(k) + ": ", x) for k, x in v.items()] if isinstance(v, dict)
             else [("", x) for x in v])
    lines: list[str] = []
    line = " " * col + o
    for n, (prefix, x) in enumerate(items):
        tail = c if n == len(items) - 1 else ","
        sep = "" if line.endswith(o) or line.isspace() else " "
        start = len(line) + len(sep) + len(prefix)
        text = prefix + _r(x, start, ind) + tail
        if ("\n" in text or start - len(prefix) + len(text) > 99) and not line.endswith(o):
            lines.append(line)
            line = " " * (col + 1)
            text = prefix + _r(x, col + 1 + len(prefix), ind) + tail
            sep = ""
        line += sep + text
        if "\n" in line:
            *done, line = line.split("\n")
            lines += done
    lines.append(line)
    return "\n".join(lines)[col:]


def render_block(values: dict, begin: str, end: str) -> str:
    lines = [begin]
    for key, v in values.items():
        if key == "REUSED_KERNELS":
            body = "".join(f'    "{d}": {_r(ks, 8 + len(d), 4)},\n' for d, ks in v.items())
            lines.append(f"{key} = {{\n{body}}}" if v else f"{key} = {{}}")
        else:
            lines.append(f"{key} = {_r(v, len(key) + 3)}")
    lines.append(end)
    return "\n".join(lines) + "\n"


def write_manifest(tree: Tree, pkg: Package) -> bool:
    """Rewrite the generated block of ``pkg``'s ``cake_build.py``; True if it changed."""
    b = tree.build_mod
    text = pkg.manifest_file.read_text()
    i, j = text.find(b.GENERATED_BEGIN), text.find(b.GENERATED_END)
    if i < 0 or j < i:
        raise SystemExit(f"{pkg.manifest_file}: no generated block markers "
                         f"({b.GENERATED_BEGIN!r} ... {b.GENERATED_END!r})")
    g = load_manifest_module(pkg)
    block = render_block(expected_generated(tree, pkg, g), b.GENERATED_BEGIN, b.GENERATED_END)
    rest = text[j + len(b.GENERATED_END):]
    new = text[:i] + block + (rest[1:] if rest.startswith("\n") else rest)
    if new != text:
        pkg.manifest_file.write_text(new)
    return new != text


def _literals(path: Path) -> dict:
    """Module-level literal assignments of a (possibly old-format) ``cake_build.py``, and
    the kernel list of an old ``MANIFEST = {**FAMILY, "kernels": [...]}``; read with
    ``ast``, nothing executed."""
    tree = _parse(path) if path.is_file() else None
    out: dict = {"__doc__": ast.get_docstring(tree) if tree else None}
    for n in tree.body if tree else []:
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name)):
            continue
        name = n.targets[0].id
        try:
            out[name] = ast.literal_eval(n.value)
            continue
        except ValueError:
            pass
        if name == "MANIFEST" and isinstance(n.value, ast.Dict):
            for k, v in zip(n.value.keys, n.value.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "kernels":
                    try:
                        out["OLD_KERNELS"] = ast.literal_eval(v)
                    except ValueError:
                        pass
    return out


def render_manifest_file(dist: str, doc: str | None, family: dict, shared: list[dict],
                         extra: list[str], reuses: list[dict], b) -> str:
    """A ``cake_build.py`` in the current format with an empty generated block."""
    head = f"Build manifest of {dist}: plain data (format: cake_core.build)."
    body = [l for l in (doc or "").split("\n\n")[1:] if "generated block" not in l]
    tail = ("Imports nothing. The generated block is written by\n"
            "``python3 shared/check_cake_build_manifests.py --write`` and checked by\n"
            "``nox -s manifests``; the rest is kept by hand.")
    text = '"""' + "\n\n".join([head, *body, tail]) + '\n"""\n\nimport copy\n\nFAMILY = {\n'
    text += "".join(f'    "{k}": {_r(v, 8 + len(k), 4)},\n' for k, v in family.items()) + "}\n\n"
    text += "#: kernels of other cake packages this package launches or calls (kept by hand)\n"
    text += f"SHARED_KERNELS = {_r(shared, 17)}\n\n"
    text += ("#: modules of other packages whose code fixes the bits, beyond the kernels "
             "listed here and\n#: the jitted functions they call (digested too; every "
             "module of this package is digested)\n")
    text += f"DIGEST_EXTRA = {_r(extra, 15)}\n\n"
    gen = {"KERNELS": [], "PLANS": [], "PACKAGE_DATA": []}
    if reuses:
        gen["REUSED_KERNELS"] = {r["name"]: [] for r in reuses}
    gen["SOURCE_DIGEST"] = "sha256:"
    text += render_block(gen, b.GENERATED_BEGIN, b.GENERATED_END) + "\n"
    if reuses:
        text += ("#: the sibling registry: the local package whose kernels every rank runs\n"
                 "REUSES = [\n")
        for r in reuses:
            text += "    {\n"
            for k in ("name", "import_name", "version_range", "entry_points"):
                text += f'        "{k}": {_r(r.get(k, []), 12 + len(k), 8)},\n'
            text += f'        "kernels": REUSED_KERNELS["{r["name"]}"],\n    }},\n'
        text += "]\n\n"
    kernels = ('KERNELS + SHARED_KERNELS + [k for r in REUSES for k in r["kernels"]]'
               if reuses else "KERNELS + SHARED_KERNELS")
    text += ("MANIFEST = {\n    **FAMILY,\n"
             f'    "kernels": {kernels},\n'
             '    "plans": PLANS,\n    "package_data": PACKAGE_DATA,\n'
             '    "source_digest": SOURCE_DIGEST,\n'
             f'    "reuses": {"REUSES" if reuses else "[]"},\n}}\n\n\n'
             "def manifest() -> dict:\n"
             '    """A copy of :data:`MANIFEST` (reads no file, imports nothing)."""\n'
             "    return copy.deepcopy(MANIFEST)\n")
    return text


def init_manifest(tree: Tree, pkg: Package) -> bool:
    """Create ``pkg``'s ``cake_build.py`` if it is missing, or convert one without a
    generated block (the older format that computed its digest at run time); the generated
    block is filled by :func:`write_manifest` afterwards. False if nothing was to do (the
    file has its block, or ``pkg`` is a legacy distribution without one)."""
    b = tree.build_mod
    f = pkg.manifest_file
    if f.is_file() and b.GENERATED_BEGIN in f.read_text():
        return False
    if not f.is_file() and tree.registry.is_legacy(pkg.dist):
        return False
    old = _literals(f)
    family = dict(old.get("FAMILY") or {})
    entry = None
    if tree.registry.mod is not None:
        try:
            entry = tree.registry.entry(pkg.dist)
        except KeyError:
            entry = None
    names = sorted((public_names(pkg.src / "__init__.py") or set()) - {"__version__"})
    family = {
        "name": pkg.dist, "import_name": pkg.import_name,
        "version": read_version_file(pkg) or family.get("version", "0"),
        "mode": family.get("mode", entry.mode if entry else "det"),
        "kind": family.get("kind", FAMILY_KIND.get(entry.kind, entry.kind) if entry
                           else "local"),
        "entry_points": family.get("entry_points", names),
    }
    reuses = [dict(r) for r in old.get("REUSES", [])]
    if family["kind"] == "kcp" and not reuses and entry is not None:
        deps = {}  # name -> the range as pyproject.toml writes it
        for d in pkg.pyproject["project"].get("dependencies", []):
            name = Requirement(d).name
            raw = d.split(";")[0].strip()
            deps[name] = (raw[len(name):].strip() if raw.startswith(name)
                          else str(Requirement(d).specifier))
        for e in tree.registry.mod.REGISTRY:
            if e.family == entry.family and e.kind == "local" and e.dist in deps:
                reuses.append({"name": e.dist, "import_name": e.import_name,
                               "version_range": deps[e.dist], "entry_points": []})
    sib_imports = {r.get("import_name") for r in reuses}
    shared = [k for k in old.get("OLD_KERNELS", []) + old.get("SHARED_KERNELS", [])
              if isinstance(k, dict) and str(k.get("module")).split(".")[0]
              not in ({pkg.import_name} | sib_imports)]
    shared = [k for i, k in enumerate(shared) if k not in shared[:i]]
    extra = [x for x in old.get("DIGEST_EXTRA", [])  # own modules are always digested
             if str(x).split(".")[0] != pkg.import_name]
    f.write_text(render_manifest_file(pkg.dist, old.get("__doc__"), family, shared, extra,
                                      reuses, b))
    return True


# ---------------------------------------------------------------------------- building


_HOOK = ("import importlib, sys; b = importlib.import_module(sys.argv[1]); "
         "print(getattr(b, 'build_' + sys.argv[2])(sys.argv[3]))")


def build(pkg: Package, out: Path, builder: str = "hooks") -> tuple[Path, Path]:
    """Build ``pkg``'s sdist into ``out``, then its wheel from the unpacked sdist. Returns
    (sdist, wheel); ``RuntimeError`` with the tool's output when a step fails."""
    out.mkdir(parents=True, exist_ok=True)

    def run(cmd, cwd):
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{r.stdout}\n{r.stderr}")

    if builder == "build":  # python -m build: the sdist, then the wheel from it
        run([sys.executable, "-m", "build", "--outdir", str(out), str(pkg.path)], pkg.path)
    else:
        system = pkg.pyproject.get("build-system", {})
        backend = system.get("build-backend", "setuptools.build_meta")
        try:
            found = importlib.util.find_spec(backend.split(":")[0].split(".")[0]) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            need = " ".join(repr(r) for r in system.get("requires", [])) or backend
            raise RuntimeError(f"the build backend {backend!r} is not importable by "
                               f"{sys.executable}: install it (pip install {need}), or "
                               "check with --no-build, or build with --builder build")
        run([sys.executable, "-c", _HOOK, backend, "sdist", str(out)], pkg.path)
        (sdist,) = out.glob("*.tar.gz")
        unpacked = out / "sdist"
        with tarfile.open(sdist) as tf:
            if sys.version_info >= (3, 12):
                tf.extractall(unpacked, filter="data")
            else:
                tf.extractall(unpacked)
        (top,) = unpacked.iterdir()
        run([sys.executable, "-c", _HOOK, backend, "wheel", str(out)], top)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def _metadata(text: str):
    return email.parser.Parser().parsestr(text)


def check_built(pkg: Package, sdist: Path, wheel: Path) -> list[Finding]:
    f: list[Finding] = []
    add = lambda kind, detail: f.append(Finding(pkg.dist, kind, detail))
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = _metadata(zf.read(meta_name).decode())
    with tarfile.open(sdist) as tf:
        (pkg_info,) = [m for m in tf.getmembers() if m.name.count("/") == 1
                       and m.name.endswith("/PKG-INFO")]
        sdist_meta = _metadata(tf.extractfile(pkg_info).read().decode())
    prefix = pkg.import_name + "/"
    in_wheel = {n[len(prefix):] for n in names if n.startswith(prefix)}
    src = set(source_files(pkg.src))
    for rel in sorted(src - in_wheel):
        add("wheel-missing", f"src/{pkg.import_name}/{rel} is not in {wheel.name}")
    for rel in sorted(in_wheel - src):
        add("wheel-extra", f"{pkg.import_name}/{rel} in {wheel.name} is not in the source "
                           "tree")
    for n in names:
        if not n.startswith(prefix) and ".dist-info/" not in n:
            add("wheel-extra", f"{n} in {wheel.name} is not in the source tree")
    if not meta.get("Requires-Python"):
        add("requires-python", f"{wheel.name} metadata has no Requires-Python")
    vfile = read_version_file(pkg)
    for what, v in (("wheel", meta.get("Version")), ("sdist", sdist_meta.get("Version"))):
        if vfile is not None and v is not None and Version(v) != Version(vfile):
            add("version-mismatch", f"{what} metadata version {v} != {vfile} in "
                                    f"{pkg.version_file.relative_to(pkg.path)}")
    if meta.get("Name") and meta["Name"] != pkg.dist:
        add("name-unknown", f"wheel metadata name {meta['Name']!r} != {pkg.dist!r}")
    return f


# ---------------------------------------------------------------------------- checking


def _kref(k: dict) -> str:
    return f"{k.get('module')}.{k.get('function')}"


def check_static(tree: Tree, pkg: Package) -> list[Finding]:
    """Every check that needs no built distribution."""
    f: list[Finding] = []
    add = lambda kind, detail: f.append(Finding(pkg.dist, kind, detail))
    proj = pkg.pyproject["project"]
    if not proj.get("requires-python"):
        add("requires-python", "pyproject.toml [project] has no requires-python")
    vfile = read_version_file(pkg)
    if vfile is None:
        add("version-mismatch", "no __version__ in the version file "
                                f"({pkg.version_file or '[tool.hatch.version] path unset'})")
    if "version" in proj and vfile and proj["version"] != vfile:
        add("version-mismatch", f"pyproject.toml version {proj['version']} != {vfile}")

    reg = tree.registry
    legacy = reg.is_legacy(pkg.dist)
    entry = None
    if reg.mod is None:
        add("name-unknown", f"no name registry at {reg.path}")
    elif not legacy:
        try:
            entry = reg.entry(pkg.dist)
        except KeyError:
            add("name-unknown", f"the registry does not know the distribution {pkg.dist!r}")
        if entry is not None and entry.import_name != pkg.import_name:
            add("name-unknown", f"import name {pkg.import_name!r} != the registry's "
                                f"{entry.import_name!r}")

    if legacy and not pkg.manifest_file.is_file():
        f += check_pins(tree, pkg)
        for k in own_kernels(pkg):  # a legacy distribution is an import stub
            add("kernel-unlisted", f"legacy distribution defines the kernel {_kref(k)}")
        return f
    if not pkg.manifest_file.is_file():
        add("manifest", f"no {pkg.manifest_file.relative_to(pkg.path)}")
        return f + check_pins(tree, pkg)
    try:
        g = load_manifest_module(pkg)
        m = g["manifest"]()
        fam = g["FAMILY"]
    except Exception as e:  # noqa: BLE001
        add("manifest", f"cake_build.py does not load: {type(e).__name__}: {e}")
        return f + check_pins(tree, pkg)
    f += check_pins(tree, pkg, {str(r.get("name")) for r in g.get("REUSES", [])
                                if isinstance(r, dict)})
    for p in tree.build_mod.validate_manifest(m):
        add("manifest", p)
    if fam.get("name") != pkg.dist or fam.get("import_name") != pkg.import_name:
        add("manifest", f"FAMILY names {fam.get('name')!r} / {fam.get('import_name')!r}, "
                        f"pyproject.toml {pkg.dist!r} / {pkg.import_name!r}")
    public = public_names(pkg.src / "__init__.py")
    for e in fam.get("entry_points", []):
        if public is not None and e not in public:
            add("manifest", f"FAMILY entry point {e!r} is not in {pkg.import_name}.__all__")
    if vfile and fam.get("version") != vfile:
        add("version-mismatch", f"cake_build FAMILY version {fam.get('version')} != {vfile}")
    if entry is not None:
        want = {"mode": entry.mode, "kind": FAMILY_KIND.get(entry.kind, entry.kind)}
        for key, v in want.items():
            if fam.get(key) != v:
                add("name-unknown", f"FAMILY {key} {fam.get(key)!r} != {v!r} (the registry's "
                                    f"{key} {getattr(entry, key)!r})")
        if entry.kind == "kcp" and not g.get("REUSES"):
            add("sibling-kernel", "a KCP package needs a sibling registry (REUSES)")

    # kernels
    exp = expected_generated(tree, pkg, g)
    listed_own = list(g.get("KERNELS", []))
    for k in exp["KERNELS"]:
        if k not in listed_own:
            add("kernel-unlisted", f"{_kref(k)} is an @triton.jit function not in KERNELS")
    for k in m.get("kernels", []):
        if not isinstance(k, dict):
            continue
        mf = tree.module_file(k.get("module", ""))
        if mf is None or k.get("function") not in jit_functions(mf):
            where = "no such module" if mf is None else f"not an @triton.jit function of {mf.name}"
            add("kernel-missing", f"{_kref(k)} is listed but missing ({where})")
        top = str(k.get("module", "")).split(".")[0]
        if reg.mod is not None and not reg.knows_import(top):
            add("name-unknown", f"kernel module {k.get('module')!r}: the registry does not "
                                f"know {top!r}")
    if g.get("SOURCE_DIGEST") != exp["SOURCE_DIGEST"] or m.get("source_digest") != g.get(
            "SOURCE_DIGEST"):
        mods = digest_modules(tree, pkg, m.get("kernels", []), g.get("DIGEST_EXTRA", []))
        own = [x for x in mods if x.split(".")[0] == pkg.import_name]
        other = [x for x in mods if x not in own]
        add("digest-stale", f"SOURCE_DIGEST {str(g.get('SOURCE_DIGEST'))[:19]}... != "
                            f"{exp['SOURCE_DIGEST'][:19]}... over the {len(own)} modules of "
                            f"{pkg.import_name}" + (f" and {', '.join(other)}" if other else "")
                            + "; run: python3 shared/check_cake_build_manifests.py --write")
    if g.get("PLANS") != exp["PLANS"]:
        have = {p.get("class"): p for p in g.get("PLANS", []) if isinstance(p, dict)}
        want = {p["class"]: p for p in exp["PLANS"]}
        diff = [f"{c} not listed" for c in want if c not in have]
        diff += [f"{c} listed but not found" for c in have if c not in want]
        diff += [f"{c} differs (fields / format_version / module)" for c in want
                 if c in have and have[c] != want[c]]
        add("plans-stale", "PLANS disagrees with the sources: " + ("; ".join(diff)
                                                                  or "order differs"))
    for dist, ks in exp.get("REUSED_KERNELS", {}).items():
        have = (g.get("REUSED_KERNELS") or {}).get(dist)
        if have is not None and have != ks:
            gone = [_kref(k) for k in ks if k not in have]
            add("sibling-kernel", f"REUSED_KERNELS[{dist!r}] differs from {dist}'s manifest "
                                  f"kernels" + (f" (lacks {', '.join(gone)})" if gone else ""))
    if g.get("PACKAGE_DATA") != exp["PACKAGE_DATA"]:
        add("package-data", f"PACKAGE_DATA {g.get('PACKAGE_DATA')} != the package's "
                            f"non-.py files {exp['PACKAGE_DATA']}")
    f += check_reuses(tree, pkg, g)
    return f


def check_pins(tree: Tree, pkg: Package, skip: set[str] = frozenset()) -> list[Finding]:
    """``dependency-version``: each requirement of ``pkg`` (its dependencies and extras) on
    another package of the monorepo whose range excludes that package's version file
    (pre-releases count as inside a range that spans them). ``skip``: names a sibling
    registry covers (reported as ``sibling-version``)."""
    f: list[Finding] = []
    proj = pkg.pyproject["project"]
    reqs = list(proj.get("dependencies", []))
    for extra in proj.get("optional-dependencies", {}).values():
        reqs += extra
    for d in reqs:
        try:
            req = Requirement(d)
        except Exception:  # noqa: BLE001 - the build reports it
            continue
        dep = tree.by_dist.get(req.name)
        if dep is None or req.name in skip or dep is pkg:
            continue
        v = read_version_file(dep)
        if v is not None and not req.specifier.contains(Version(v), prereleases=True):
            f.append(Finding(pkg.dist, "dependency-version",
                             f"requires {d!r}, but {req.name} is at {v} in "
                             f"{dep.path.relative_to(dep.path.parent.parent)}: widen the "
                             "range (docs/releasing.md, step 1)"))
    return f


def check_reuses(tree: Tree, pkg: Package, g: dict) -> list[Finding]:
    f: list[Finding] = []
    add = lambda kind, detail: f.append(Finding(pkg.dist, kind, detail))
    deps = {}
    for d in pkg.pyproject["project"].get("dependencies", []):
        req = Requirement(d)
        deps[req.name] = req.specifier
    for r in g.get("REUSES", []):
        name = r.get("name")
        sib = tree.by_dist.get(name)
        reg = tree.registry
        if reg.mod is not None:
            try:
                reg.entry(name)
            except KeyError:
                add("name-unknown", f"sibling registry names {name!r}, unknown to the registry")
        if sib is None:
            add("sibling-kernel", f"sibling registry names {name!r}: no such package")
            continue
        if r.get("import_name") != sib.import_name:
            add("sibling-kernel", f"sibling registry import name {r.get('import_name')!r} != "
                                  f"{sib.import_name!r}")
        try:
            spec = SpecifierSet(r.get("version_range", ""))
        except Exception:  # noqa: BLE001
            add("sibling-version", f"{name}: version range {r.get('version_range')!r} "
                                   "does not parse")
            spec = None
        sv = read_version_file(sib)
        if spec is not None and sv is not None and Version(sv) not in spec:
            add("sibling-version", f"{name} {sv} is outside the registry's range "
                                   f"{r.get('version_range')!r}")
        if spec is not None and deps.get(name) != spec:
            add("sibling-version", f"registry range {r.get('version_range')!r} for {name} != "
                                   f"pyproject.toml's {str(deps.get(name, 'no dependency'))!r}")
        try:
            sm = load_manifest_module(sib)["MANIFEST"]
        except Exception:  # noqa: BLE001
            sm = {"kernels": []}
        for k in r.get("kernels", []):
            mf = tree.module_file(k.get("module", ""))
            if (k not in sm["kernels"] or mf is None
                    or k.get("function") not in jit_functions(mf)):
                add("sibling-kernel", f"sibling registry kernel {_kref(k)} does not exist in "
                                      f"{name}")
        names = public_names(sib.src / "__init__.py")
        for e in r.get("entry_points", []):
            if names is not None and e not in names:
                add("sibling-kernel", f"sibling registry entry point {e!r} is not a public "
                                      f"name of {sib.import_name}")
    return f


def check_packages(tree: Tree, pkgs: list[Package], *, do_build: bool = True,
                   builder: str = "hooks", jobs: int | None = None,
                   keep: Path | None = None) -> tuple[list[Finding], dict[str, float]]:
    """Findings for ``pkgs`` and the seconds each package's build took."""
    findings: list[Finding] = []
    times: dict[str, float] = {}
    for pkg in pkgs:
        findings += check_static(tree, pkg)
    if not do_build:
        return findings, times
    tmp = Path(tempfile.mkdtemp(prefix="cake-manifests-")) if keep is None else keep

    def one(pkg: Package) -> list[Finding]:
        t0 = time.perf_counter()
        try:
            sdist, wheel = build(pkg, tmp / pkg.dist, builder)
        except Exception as e:  # noqa: BLE001
            return [Finding(pkg.dist, "build", str(e).strip()[-2000:])]
        finally:
            times[pkg.dist] = time.perf_counter() - t0
        return check_built(pkg, sdist, wheel)

    try:
        with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 2) as ex:
            for res in ex.map(one, pkgs):
                findings += res
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return findings, times


def _order(pkgs: list[Package], tree: Tree) -> list[Package]:
    """Packages with a sibling registry after the packages they reuse."""
    def rank(p: Package) -> int:
        try:
            return 1 if load_manifest_module(p).get("REUSES") else 0
        except Exception:  # noqa: BLE001
            return 0
    return sorted(pkgs, key=lambda p: (rank(p), p.dist))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", nargs="*", type=Path,
                    help="package folders, or distribution names under packages/ (default: "
                         "every packages/*/)")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="monorepo root: siblings, cake-core and the registry come from here")
    ap.add_argument("--write", action="store_true",
                    help="regenerate each cake_build.py's generated block, then check")
    ap.add_argument("--init", action="store_true",
                    help="create a missing cake_build.py, or convert one without a generated "
                         "block (the older format), then --write")
    ap.add_argument("--no-build", action="store_true", help="static checks only")
    ap.add_argument("--builder", choices=("hooks", "build"), default="hooks",
                    help="hooks: call the PEP 517 backend directly (fast; the backend must "
                         "be importable); build: python -m build (isolated envs)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep built files here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    root = args.root.resolve()
    paths = args.packages or sorted(p.parent for p in (root / "packages").glob("*/pyproject.toml"))
    pkgs = []
    for p in paths:
        d = Path(p)
        if not (d / "pyproject.toml").is_file() and (root / "packages" / p / "pyproject.toml"
                                                      ).is_file():
            d = root / "packages" / p  # a distribution name: packages/<name>
        if not (d / "pyproject.toml").is_file():
            ap.error(f"{p}: not a package folder (no {d / 'pyproject.toml'}); give a folder "
                     f"under {root / 'packages'} or a distribution name, e.g. "
                     "packages/cake-core or cake-core")
        try:
            pkgs.append(load_package(d.resolve()))
        except (OSError, KeyError, ValueError) as e:
            ap.error(f"{p}: pyproject.toml does not load: {type(e).__name__}: {e}")
    tree = Tree(root, pkgs)
    if args.init:
        for pkg in pkgs:
            if init_manifest(tree, pkg):
                print(f"created {pkg.manifest_file.relative_to(pkg.path.parent.parent)}")
    if args.write or args.init:
        for pkg in _order(pkgs, tree):
            if pkg.manifest_file.is_file() and write_manifest(tree, pkg):
                print(f"wrote {pkg.manifest_file.relative_to(pkg.path.parent.parent)}")
    findings, times = check_packages(tree, pkgs, do_build=not args.no_build,
                                     builder=args.builder, jobs=args.jobs, keep=args.keep)
    for fd in findings:
        print(fd)
    slow = max(times.items(), key=lambda kv: kv[1]) if times else None
    print(f"{len(pkgs)} packages, {len(findings)} findings, "
          f"{time.perf_counter() - t0:.1f} s"
          + (f" (builds: slowest {slow[0]} {slow[1]:.1f} s)" if slow else ""))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
