"""nox sessions of the cake monorepo.

    nox -s "family(rmsnorm)"   one package's tests, in an env holding only that package,
                               cake-core and their declared dependencies
    nox -s tests               every family and legacy-name session, tests-integration,
                               the manifest check and a release dry run of cake-core
    nox -s manifests           build every package (sdist, wheel from the sdist) and check
                               its build manifest (shared/check_cake_build_manifests.py)
    nox -s wheels              the same builds, every wheel copied into dist/
    nox -s "release(core)"     the release checks of one family (docs/releasing.md)
    nox -s demo                the main job (cake-tinylm train) on its defaults
    nox -s "family(legacy_gdn)"  a legacy name's import stub with its canonical target(s)
    nox -s names_doc           write docs/training_backend_names.md from cake_core.names
    nox -s legacy_packages     write the legacy distributions from cake_core.names
    nox -s lint                ruff

Runs on the CPU through Triton's interpreter when no CUDA device is present.

Where the Python running nox holds BASE (torch, Triton, numpy, pytest, pytest-xdist) and
hatchling at admitted versions, as .ci/run installs them first, the family, integration and
demo envs see them through `--system-site-packages` and install only their cake packages
(an env that sees any other installed cake distribution fails; pytest loads only xdist,
no auto-loaded plugins); else each env holds its own torch and Triton (about 1.6 GB).
Torch is then the CPU build from PyTorch's CPU index (https://download.pytorch.org/whl/cpu),
here and in the release check's clean install, unless pip is configured with sources of its
own (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX or pip.conf: local
wheels, a mirror), which then serve it. A session deletes its env when it ends, so
`nox -s tests` needs disk for one env at a time, not ten (a CI machine ran out of disk
otherwise). Set CAKE_NOX_KEEP_ENVS=1 to keep them (with `-r`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

#: family id -> distribution folder under packages/
FAMILIES = {
    "core": "cake-core",
    "rmsnorm": "cake-rmsnorm-det-train",
    "rmsnorm_nondet": "cake-rmsnorm-nondet-train",
    "lmhead": "cake-lm-head-loss-det-train",
    "lmhead_nondet": "cake-lm-head-loss-nondet-train",
    "dense": "cake-dense-projection-det-gemm",
    "dense_nondet": "cake-dense-projection-nondet-gemm",
    "gdn": "cake-gdn-det-train",
    "gdn_kcp": "cake-gdn-det-train-kcp",
    "gdn_nondet": "cake-gdn-nondet-train",
    "gdn_nondet_kcp": "cake-gdn-nondet-train-kcp",
    "gate_norm": "cake-rmsnorm-silu-gate-det-train",
    "gate_norm_nondet": "cake-rmsnorm-silu-gate-nondet-train",
    "conv": "cake-causal-conv1d-det-train",
    "conv_nondet": "cake-causal-conv1d-nondet-train",
    "kda": "cake-kda-det-train",
    "kda_kcp": "cake-kda-det-train-kcp",
    "kda_nondet": "cake-kda-nondet-train",
    "kda_nondet_kcp": "cake-kda-nondet-train-kcp",
    "conv_kcp": "cake-causal-conv1d-det-train-kcp",
    "moe": "cake-moe-grouped-det-gemm",
    "moe_nondet": "cake-moe-grouped-nondet-gemm",
    "mhc": "cake-mhc-det-train",
    "mhc_nondet": "cake-mhc-nondet-train",
    "gqa_det": "cake-gqa-det-train",
    "gqa": "cake-gqa-train",
    "tinylm": "cake-tinylm",
    "transformers": "cake-transformers",
}

#: legacy id -> legacy distribution folder (import stubs of the old names; each runs alone
#: with its canonical target(s) and cake-core, like a family). New ones: shared/legacy_packages.py
LEGACY = {
    "legacy_rmsnorm": "cake-rmsnorm-train",
    "legacy_gate_norm": "cake-rmsnorm-silu-gate-train",
    "legacy_dense": "cake-dense-projection-gemm",
    "legacy_lmhead": "cake-lm-head-loss-train",
    "legacy_moe": "cake-moe-grouped-gemm",
    "legacy_conv": "cake-causal-conv1d-train",
    "legacy_gdn": "cake-gdn-train",
    "legacy_kda": "cake-kda-train",
    "legacy_mhc": "cake-mhc-train",
}
# a legacy folder not written yet (its canonical target lives in another branch) is skipped;
# packages/cake-core/tests/test_core_names.py fails once the target exists and it does not
LEGACY = {k: v for k, v in LEGACY.items() if (ROOT / "packages" / v).is_dir()}

#: every id `family(<id>)` accepts
PACKAGES = {**FAMILIES, **LEGACY}

#: installed first in every env: the pinned CPU torch that lies on the CI machine's disk
#: (a GPU machine keeps its own), the Triton the GPU has, and an interpreter-safe numpy.
BASE = ["torch==2.13.0", "triton==3.6.0", "numpy>=1.24,<2.4", "pytest>=7",
        "pytest-xdist>=3.2"]


#: where an env that installs its own torch takes it when pip is given no source besides
#: PyPI: PyTorch's CPU wheel index (pytorch.org's install command for CPU-only Linux), whose
#: torch is the CPU build; PyPI's Linux torch is the CUDA build (several GB of NVIDIA
#: libraries this CPU-only use never loads)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

#: pip options that name where packages come from (an index, local wheels, or none)
_PIP_SOURCES = ("index-url", "extra-index-url", "find-links", "no-index")


@functools.cache
def _pip_has_sources() -> bool:
    """Whether pip is configured with a source besides PyPI (``PIP_INDEX_URL``,
    ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX`` or the same options in
    pip's config files, as ``pip config list`` shows them): then torch comes from there
    (a machine with local wheels, a mirror) and nox adds no index of its own."""
    if any(os.environ.get("PIP_" + k.upper().replace("-", "_")) for k in _PIP_SOURCES):
        return True
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(ln.split("=", 1)[0].rsplit(".", 1)[-1] in _PIP_SOURCES
               for ln in out.splitlines() if "=" in ln)


def _torch_index() -> str | None:
    """:data:`TORCH_CPU_INDEX`, unless pip is configured with sources of its own."""
    return None if _pip_has_sources() else TORCH_CPU_INDEX


#: what the manifest check and the release builds need (no torch, no Triton)
BUILD_TOOLS = ["hatchling>=1.18", "packaging>=23", "tomli>=2; python_version < '3.11'",
               "pytest>=7"]


def _base_in_system() -> bool:
    """Whether the Python running nox already holds BASE and hatchling at versions they
    admit (.ci/run installs them there first). Then the envs that install BASE see that
    Python's site-packages (``--system-site-packages``) instead of installing torch and
    Triton into each env (about 45 s and 1.6 GB per session on the 2-core CI machine; 26
    sessions). The envs still get only their own cake packages: :func:`_install` refuses
    an env that sees any other installed cake distribution."""
    from importlib import metadata

    from packaging.requirements import Requirement

    for spec in [*BASE, BUILD_TOOLS[0]]:
        req = Requirement(spec)
        try:
            got = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            return False
        if not req.specifier.contains(got, prereleases=True):
            return False
    return True


#: the envs' venv options: see :func:`_base_in_system`
VENV_PARAMS = ["--system-site-packages"] if _base_in_system() else []

#: a session's python -c: exit with a message if the env sees an installed cake-*
#: distribution other than those named on the command line (its own)
_FOREIGN_CHECK = (
    "import re, sys, importlib.metadata as m; "
    "n = lambda d: re.sub(r'[-_.]+', '-', d).lower(); "
    "own = {n(d) for d in sys.argv[1:]}; "
    "s = sorted({n(d.metadata['Name']) for d in m.distributions()} - own); "
    "s = [d for d in s if d.startswith('cake-')]; "
    "sys.exit('installed where this env sees them, outside its packages: ' + ', '.join(s) "
    "if s else 0)")


#: pytest's plugins in the test sessions: xdist only, none auto-loaded (an env on the system
#: site-packages would otherwise load whatever plugins that Python holds)
PYTEST_PLUGINS = ["-p", "no:cacheprovider", "-p", "xdist.plugin"]


def _pytest_env(workers: list[str]) -> dict[str, str]:
    """No plugin auto-loading; with workers, torch on one thread each."""
    return {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            **({"OMP_NUM_THREADS": "1"} if workers else {})}


def _workers() -> list[str]:
    """pytest-xdist options of the family and integration sessions: one worker per core,
    at most 8 (``$CAKE_TEST_WORKERS`` sets the count; 0 runs in one process). Under Triton's
    interpreter the tests are single-threaded Python: 2 workers took the KDA tests from
    about 31 to 18 minutes on the 2-core CI machine. Each worker runs torch on one thread
    (2 workers with 2 threads each oversubscribe those cores). Work stealing: a few tests
    take minutes."""
    n = int(os.environ.get("CAKE_TEST_WORKERS", min(os.cpu_count() or 1, 8)))
    return ["-n", str(n), "--dist", "worksteal"] if n > 1 else []


def _local_closure(dist: str) -> list[str]:
    """The package folder and those of every cake-* package it depends on (recursively),
    its extras' included (GDN's ``layers``: its tests build the whole layer)."""
    seen: list[str] = []

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.append(name)
        meta = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
        extras = meta["project"].get("optional-dependencies", {}).values()
        for dep in [*meta["project"].get("dependencies", []), *(d for e in extras for d in e)]:
            dep_name = dep.split(";")[0].split("[")[0]
            for sep in "<>=!~ ":
                dep_name = dep_name.split(sep)[0]
            if dep_name.startswith("cake-") and (ROOT / "packages" / dep_name).is_dir():
                visit(dep_name)

    visit(dist)
    return [str(ROOT / "packages" / n) for n in seen]


@contextmanager
def _env_dropped_after(session: nox.Session):
    """Delete the session's env when the block ends, unless CAKE_NOX_KEEP_ENVS=1."""
    try:
        yield
    finally:
        location = getattr(session.virtualenv, "location", None)
        if location and os.environ.get("CAKE_NOX_KEEP_ENVS") != "1":
            shutil.rmtree(location, ignore_errors=True)


def _install(session: nox.Session, dists: list[str], *, compile_pyc: bool = True) -> None:
    """BASE, then the local packages. ``compile_pyc=False`` skips pip's byte-compilation of
    torch (about 30 s of a session on the 2-core CI machine): worth it where one short
    pytest process imports torch once (the legacy-name sessions), not where many do.
    The local packages build with the env's hatchling (every package's only build
    requirement) instead of one isolated build env each: 7.4 -> 3.5 s for three packages
    on the 2-core machine, hatchling's install included. An env that installs its own torch
    (no ``--system-site-packages``) takes it first from :func:`_torch_index` alone, as
    pytorch.org's CPU-only install command does (``--index-url``); BASE then finds it
    installed."""
    no_pyc = [] if compile_pyc else ["--no-compile"]
    torch_pin = next(b for b in BASE if b.startswith("torch=="))
    if not VENV_PARAMS and _torch_index():  # its own torch: the CPU build, as pytorch.org says
        session.install("--index-url", _torch_index(), torch_pin, *no_pyc)
    session.install(*BASE, BUILD_TOOLS[0], *no_pyc)
    paths: list[str] = []
    for d in dists:
        for p in _local_closure(d):
            if p not in paths:
                paths.append(p)
    for p in paths:  # what --no-build-isolation relies on
        meta = tomllib.loads((Path(p) / "pyproject.toml").read_text())
        if meta["build-system"]["requires"] != [BUILD_TOOLS[0]]:
            session.error(f"{p}: build requirements other than {BUILD_TOOLS[0]!r}: build it "
                          "in an isolated env (noxfile.py _install)")
    session.install("--no-build-isolation", *paths)
    # an env on the system site-packages must not see cake packages other than its own
    session.run("python", "-c", _FOREIGN_CHECK, *(Path(p).name for p in paths), silent=True)


@nox.session(venv_params=VENV_PARAMS)
@nox.parametrize("family", list(PACKAGES), ids=list(PACKAGES))
def family(session: nox.Session, family: str) -> None:
    """One family's or legacy name's tests, in an env with only it and its dependencies."""
    dist = PACKAGES[family]
    with _env_dropped_after(session):
        _install(session, [dist], compile_pyc=family not in LEGACY)
        # a legacy name's 9 short tests: starting workers would cost more than they save
        workers = [] if family in LEGACY else _workers()
        session.run("python", "-m", "pytest", "-q", *PYTEST_PLUGINS, *workers,
                    f"packages/{dist}/tests", *session.posargs,
                    env=_pytest_env(workers))


@nox.session(venv_params=VENV_PARAMS)
def integration(session: nox.Session) -> None:
    """tests-integration/, in one env with every package installed."""
    with _env_dropped_after(session):
        _install(session, list(FAMILIES.values()))
        workers = _workers()
        session.run("python", "-m", "pytest", "-q", *PYTEST_PLUGINS, *workers,
                    "tests-integration", *session.posargs, env=_pytest_env(workers))


@nox.session
def tests(session: nox.Session) -> None:
    """Every family(<id>) session (legacy names too), integration, manifests, release(core)."""
    # the release dry run takes cake-core: its clean install needs no other cake wheel
    for fid in PACKAGES:
        session.notify(f"family({fid})")
    session.notify("integration")
    session.notify("manifests")
    session.notify("release(core)")



@nox.session
def manifests(session: nox.Session) -> None:
    """Build every package (sdist, wheel of it), check its manifest, then run shared/tests."""
    # shared/check_cake_build_manifests.py: zero findings or the session fails; then the
    # checker's own tests (shared/tests: planted findings, release tag rules, the CI base,
    # dependency ranges). Regenerate stale manifests with
    # ``python3 shared/check_cake_build_manifests.py --write``.
    session.install(*BUILD_TOOLS)
    session.run("python", "shared/check_cake_build_manifests.py", *session.posargs)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "shared/tests")


@nox.session
def wheels(session: nox.Session) -> None:
    """Build every package's wheel (from its sdist, manifests checked) into dist/."""
    # the manifests session's build: shared/check_cake_build_manifests.py builds each sdist,
    # then the wheel from the unpacked sdist, and checks both; the wheels land in dist/
    # (`pip install dist/*.whl` installs every family with cake-core)
    session.install(*BUILD_TOOLS)
    built = Path(session.create_tmp()).resolve() / "wheels"  # the hooks run in each package
    shutil.rmtree(built, ignore_errors=True)
    session.run("python", "shared/check_cake_build_manifests.py", "--keep", str(built),
                *session.posargs)
    out = ROOT / "dist"
    out.mkdir(exist_ok=True)
    for whl in sorted(built.glob("*/*.whl")):
        shutil.copy2(whl, out / whl.name)
        session.log(f"dist/{whl.name}")
    shutil.rmtree(built, ignore_errors=True)


@nox.session
@nox.parametrize("family", list(PACKAGES), ids=list(PACKAGES))
def release(session: nox.Session, family: str) -> None:
    """One family's release checks: build, version == the tag's, clean install and import."""
    # docs/releasing.md. Manifest check and build of the family and its local cake-*
    # dependencies, built version == the tag's (``-- --tag <dist>-v<version>``,
    # ``$CAKE_RELEASE_TAG`` or the tag at HEAD; a dry run against the version file without
    # one), then install in a fresh venv with only its declared dependencies (torch / Triton
    # held to the BASE pins) and import it. Artifacts: dist/release/<dist>/.
    dist = PACKAGES[family]
    with _env_dropped_after(session):
        session.install(*BUILD_TOOLS[:3])
        pins = Path(session.virtualenv.location) / "constraints.txt"
        pins.write_text("\n".join(b for b in BASE if not b.startswith("pytest")) + "\n")
        index = ["--torch-index", _torch_index()] if _torch_index() else []
        session.run("python", "shared/release.py", dist, "--constraint", str(pins), *index,
                    *session.posargs)


@nox.session(venv_params=VENV_PARAMS)
def demo(session: nox.Session) -> None:
    """The main job, cake-tinylm train, on its embedded defaults (its options after --)."""
    with _env_dropped_after(session):
        _install(session, ["cake-tinylm"])
        session.run("cake-tinylm", "train", *session.posargs)


@nox.session(venv_backend="none")
def names_doc(session: nox.Session) -> None:
    """Write docs/training_backend_names.md from cake_core.names (-- --check: report only)."""
    # standard library only: no env, no torch
    session.run("python3", "shared/names_doc.py", *session.posargs, external=True)


@nox.session(venv_backend="none")
def legacy_packages(session: nox.Session) -> None:
    """Write the legacy distributions from cake_core.names (-- <dist>: one; -- --check)."""
    # `-- cake-mhc-train` writes one; `-- --check` reports stale files. Standard library only.
    session.run("python3", "shared/legacy_packages.py", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check of the whole repository (pyproject.toml's rules)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
