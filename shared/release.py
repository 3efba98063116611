#!/usr/bin/env python3
"""Release check of one cake distribution: build, version against the tag, clean install.

    python3 shared/release.py cake-rmsnorm-det-train --tag cake-rmsnorm-det-train-v0.1.0
    python3 shared/release.py cake-core                  # dry run: no tag at HEAD
    nox -s "release(core)" [-- --tag cake-core-v0.1.0]   # the same inside nox

Tags are ``<dist-name>-v<version>`` (``cake-gdn-det-train-kcp-v0.1.0``), one per family
release. The tag comes from ``--tag``, else ``$CAKE_RELEASE_TAG`` when it names this
distribution (one naming another is ignored, with a note), else the one tag of
this distribution at ``HEAD`` (``git tag --points-at HEAD``); with none it is a dry run
that checks against the version file instead.

Steps (docs/releasing.md): (1) run the manifest checker on the distribution and on each
local ``cake-*`` distribution it depends on (static checks, then the sdist and the wheel
built from the sdist; any finding stops the release); (2) check that the built version
equals the tag's (and the version file's); (3) unless ``--no-install``, create a fresh
virtual environment, install the wheels there (the distribution's and its local
dependencies', everything else resolved from its declared dependencies, torch first from
``--torch-index`` alone where given, e.g. PyTorch's CPU index for its CPU build; on a machine
without CUDA also cake-core's declared ``interpreter`` extra, numpy, which Triton's
interpreter needs), run ``pip check`` and import the package from a folder outside the
repository: its version, every name of ``__all__`` and its build manifest. The sdist and
wheel to upload stay in ``--out`` (``dist/release/<dist>/``), the local dependencies' in
its ``deps/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
TAG_RE = re.compile(r"^(?P<dist>cake(?:-[a-z0-9]+)+)-v(?P<version>[0-9][0-9A-Za-z.+!-]*)$")


def _checker():
    name = "check_cake_build_manifests"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "shared" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class ReleaseError(Exception):
    pass


def parse_tag(tag: str, dist: str) -> Version:
    """The version of release tag ``tag`` (``<dist>-v<version>``) for ``dist``
    (``ReleaseError`` if the tag is malformed or names another distribution)."""
    m = TAG_RE.match(tag)
    if not m:
        raise ReleaseError(f"tag {tag!r} is not <dist-name>-v<version>")
    if m["dist"] != dist:
        raise ReleaseError(f"tag {tag!r} releases {m['dist']!r}, not {dist!r}")
    try:
        return Version(m["version"])
    except InvalidVersion:
        raise ReleaseError(f"tag {tag!r}: {m['version']!r} is not a PEP 440 version") from None


def find_tag(dist: str, explicit: str | None = None, root: Path = ROOT) -> str | None:
    """``explicit``, else ``$CAKE_RELEASE_TAG`` if it names ``dist``, else the one
    ``<dist>-v*`` tag at HEAD. ``$CAKE_RELEASE_TAG`` applies to every release check of a
    run (``nox -s tests`` includes ``release(core)``): a well-formed tag of another
    distribution is ignored, with a note; a malformed one is used (and refused)."""
    if explicit:
        return explicit
    env = os.environ.get("CAKE_RELEASE_TAG", "").strip()
    if env:
        m = TAG_RE.match(env)
        if m is None or m["dist"] == dist:
            return env
        print(f"{dist}: ignoring CAKE_RELEASE_TAG={env} (it releases {m['dist']})",
              file=sys.stderr)
    try:
        r = subprocess.run(["git", "-C", str(root), "tag", "--points-at", "HEAD", "--list",
                            f"{dist}-v*"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    tags = [t for t in r.stdout.split() if TAG_RE.match(t) and TAG_RE.match(t)["dist"] == dist]
    if len(tags) > 1:
        raise ReleaseError(f"several release tags of {dist} at HEAD: {tags}")
    return tags[0] if tags else None


def local_closure(tree, dist: str) -> list:
    """``dist``'s package and those of every local cake-* distribution it depends on."""
    out: list = []

    def visit(name: str) -> None:
        pkg = tree.by_dist[name]
        if pkg in out:
            return
        out.append(pkg)
        for d in pkg.pyproject["project"].get("dependencies", []):
            req = Requirement(d)
            if req.name in tree.by_dist:
                visit(req.name)

    visit(dist)
    return out


def wheel_version(wheel: Path) -> Version:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    return Version(re.search(r"^Version: (.+)$", text, re.M)[1].strip())


_IMPORT_CHECK = r"""
import importlib, importlib.metadata as md, os, sys, sysconfig, warnings
dist, imp, version = sys.argv[1:4]
site = os.path.realpath(sysconfig.get_paths()["purelib"])
assert md.version(dist) == version, (md.version(dist), version)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # legacy names warn once
    mod = importlib.import_module(imp)
    assert os.path.realpath(mod.__file__).startswith(site), f"not the wheel's: {mod.__file__}"
    assert getattr(mod, "__version__", version) == version, mod.__version__
    names = list(getattr(mod, "__all__", []))
    for n in names:
        getattr(mod, n)
try:
    build = importlib.import_module(imp + ".cake_build")
except ModuleNotFoundError:
    build = None
if build is not None:
    assert build.manifest()["version"] == version
print(f"{dist} {version}: imported {imp} and its {len(names)} public names from "
      f"{mod.__file__}")
"""


_INTERPRETER_PROBE = (
    "import os, torch; e = os.environ.get('TRITON_INTERPRET'); "
    "print('interpreter' if (e is None and not torch.cuda.is_available()) or "
    "(e or '').strip().lower() in ('1', 'true', 'yes', 'on', 'y') else 'cuda')")


def clean_install(wheels: list[Path], dist: str, import_name: str, version: str,
                  venv: Path, constraints: Path | None, torch_index: str | None = None,
                  torch_req: str | None = None) -> None:
    """A fresh venv with only the wheels and their declared dependencies; pip check; import.
    ``torch_index``: torch (``torch_req``, the declared range) installed first from that
    index alone (PyTorch's CPU index: its CPU build), the rest then resolved as usual."""
    t0 = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    # --no-compile: no .pyc for torch's thousands of modules (a third of the install time)
    cmd = [str(py), "-m", "pip", "install", "-q", "--no-compile", *map(str, wheels)]
    if constraints is not None:
        cmd += ["-c", str(constraints)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if torch_index and torch_req:
        first = [str(py), "-m", "pip", "install", "-q", "--no-compile", "--index-url",
                 torch_index, torch_req]
        subprocess.run(first + (["-c", str(constraints)] if constraints else []), check=True,
                       env=env)
    subprocess.run(cmd, check=True, env=env)
    # Without CUDA, cake runs its kernels through Triton's interpreter, which needs numpy:
    # cake-core declares it as its ``interpreter`` extra, added here on such machines.
    probe = subprocess.run([str(py), "-c", _INTERPRETER_PROBE], capture_output=True, text=True,
                           env=env)
    core = [w for w in wheels if w.name.startswith("cake_core-")]
    if probe.stdout.strip() == "interpreter" and core:
        print(f"{dist}: no CUDA device: adding cake-core's declared 'interpreter' extra")
        extra = [str(py), "-m", "pip", "install", "-q", "--no-compile",
                 f"{core[0]}[interpreter]"]
        subprocess.run(extra + (["-c", str(constraints)] if constraints else []), check=True,
                       env=env)
    subprocess.run([str(py), "-m", "pip", "check"], check=True, env=env)
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run([str(py), "-c", _IMPORT_CHECK, dist, import_name, version],
                       check=True, env=env, cwd=cwd)
    print(f"{dist}: clean install {t1 - t0:.0f} s, import {time.perf_counter() - t1:.0f} s")


def release(dist: str, *, tag: str | None = None, out: Path | None = None,
            install: bool = True, constraints: Path | None = None,
            root: Path = ROOT, torch_index: str | None = None) -> Version:
    """Run the release checks of ``dist`` (a package under ``root/packages``); returns the
    version. ``ReleaseError`` on a failed check."""
    chk = _checker()
    tree = chk.Tree(root)
    if dist not in tree.by_dist:
        raise ReleaseError(f"no package {dist!r} under packages/")
    pkg = tree.by_dist[dist]
    tag = find_tag(dist, tag, root)
    file_version = chk.read_version_file(pkg)
    if file_version is None:
        raise ReleaseError(f"{dist}: no __version__ in its version file")
    want = parse_tag(tag, dist) if tag else Version(file_version)
    print(f"{dist}: " + (f"release tag {tag}" if tag else
                         f"dry run (no release tag at HEAD): version file {file_version}"))
    if Version(file_version) != want:
        raise ReleaseError(f"{dist}: tag {tag} wants {want}, the version file says "
                           f"{file_version}")

    out = (out or root / "dist" / "release" / dist).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pkgs = local_closure(tree, dist)
    findings, times = chk.check_packages(tree, pkgs, keep=out / "build")
    if findings:
        raise ReleaseError("manifest findings:\n" + "\n".join(map(str, findings)))
    wheels = []
    for i, p in enumerate(pkgs):  # the release's files in out/, its local dependencies' in deps/
        dst = out if i == 0 else out / "deps"
        dst.mkdir(exist_ok=True)
        for f in (out / "build" / p.dist).glob("*"):
            if f.is_file():
                shutil.copy2(f, dst / f.name)
        (w,) = dst.glob(f"{p.dist.replace('-', '_')}-*.whl")
        wheels.append(w)
    built = wheel_version(wheels[0])
    if built != want:
        raise ReleaseError(f"{dist}: built version {built} != {want} ({tag or 'version file'})")
    print(f"{dist}: built {wheels[0].name} (version {built} == "
          f"{'the tag' if tag else 'the version file'}); local dependencies: "
          f"{', '.join(p.dist for p in pkgs[1:]) or 'none'}; builds "
          f"{sum(times.values()):.1f} s")
    if install:
        venv = Path(tempfile.mkdtemp(prefix=f"{dist}-release-venv-"))
        try:
            torch_req = next((d for p in pkgs for d in p.pyproject["project"].get(
                "dependencies", []) if Requirement(d).name == "torch"), None)
            clean_install(wheels, dist, pkg.import_name, str(built), venv, constraints,
                          torch_index, torch_req)
        except subprocess.CalledProcessError as e:
            step = "import" if e.cmd[1] == "-c" else " ".join(map(str, e.cmd[1:4]))
            raise ReleaseError(f"{dist}: the clean-environment {step} failed (exit "
                               f"{e.returncode}; its output is above)") from None
        finally:
            shutil.rmtree(venv, ignore_errors=True)
    shutil.rmtree(out / "build", ignore_errors=True)
    stale = [f for p in tree.by_dist.values() if p.dist != dist
             for f in chk.check_pins(tree, p) if f"but {dist} is at" in f.detail]
    for f in stale:  # not this release's problem: theirs, released after it
        print(f"{dist}: note: {f.package} pins a range without {built}: {f.detail}")
    print(f"{dist}: release checks passed; artifacts in {out}")
    return built


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dist", help="distribution name, e.g. cake-core")
    ap.add_argument("--tag", default=None, help="release tag <dist>-v<version>")
    ap.add_argument("--out", type=Path, default=None,
                    help="artifacts folder (default dist/release/<dist>)")
    ap.add_argument("--no-install", action="store_true",
                    help="skip the clean-environment install and import")
    ap.add_argument("-c", "--constraint", type=Path, default=None,
                    help="pip constraints for the clean install (e.g. the CI's torch pin)")
    ap.add_argument("--torch-index", default=None,
                    help="install torch first from this index alone in the clean install "
                         "(https://download.pytorch.org/whl/cpu: the CPU build; nox passes "
                         "it where pip has no sources of its own)")
    args = ap.parse_args(argv)
    try:
        release(args.dist, tag=args.tag, out=args.out, install=not args.no_install,
                constraints=args.constraint, torch_index=args.torch_index)
    except ReleaseError as e:
        print(f"release check failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
