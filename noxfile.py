"""nox sessions of the cake monorepo.

    nox -s "family(rmsnorm)"   one package's tests, in an env holding only that package,
                               cake-core and their declared dependencies
    nox -s tests               every family session, then tests-integration
    nox -s demo                the main job (cake-tinylm train) on its defaults
    nox -s lint                ruff

Runs on the CPU through Triton's interpreter when no CUDA device is present.

Each env holds its own torch and Triton (about 1.6 GB). A session that installs them deletes
its env when it ends, so `nox -s tests` needs disk for one env at a time, not ten (a CI
machine ran out of disk otherwise). Set CAKE_NOX_KEEP_ENVS=1 to keep them (with `-r`).
"""

from __future__ import annotations

import os
import shutil
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
    "lmhead": "cake-lm-head-loss-det-train",
    "dense": "cake-dense-projection-det-gemm",
    "gdn": "cake-gdn-det-train",
    "gdn_kcp": "cake-gdn-det-train-kcp",
    "gate_norm": "cake-rmsnorm-silu-gate-det-train",
    "conv": "cake-causal-conv1d-det-train",
    "kda": "cake-kda-det-train",
    "kda_kcp": "cake-kda-det-train-kcp",
    "conv_kcp": "cake-causal-conv1d-det-train-kcp",
    "moe": "cake-moe-grouped-det-gemm",
    "mhc": "cake-mhc-det-train",
    "tinylm": "cake-tinylm",
}

#: installed first in every env: the pinned CPU torch that lies on the CI machine's disk
#: (a GPU machine keeps its own), the Triton the GPU has, and an interpreter-safe numpy.
BASE = ["torch==2.13.0", "triton==3.6.0", "numpy>=1.24,<2.4", "pytest>=7"]


def _local_closure(dist: str) -> list[str]:
    """The package folder and those of every cake-* package it depends on (recursively)."""
    seen: list[str] = []

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.append(name)
        meta = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
        for dep in meta["project"].get("dependencies", []):
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


def _install(session: nox.Session, dists: list[str]) -> None:
    session.install(*BASE)
    paths: list[str] = []
    for d in dists:
        for p in _local_closure(d):
            if p not in paths:
                paths.append(p)
    session.install(*paths)


@nox.session
@nox.parametrize("family", list(FAMILIES), ids=list(FAMILIES))
def family(session: nox.Session, family: str) -> None:
    """One package's tests, alone with its declared dependencies."""
    dist = FAMILIES[family]
    with _env_dropped_after(session):
        _install(session, [dist])
        session.run("pytest", "-q", "-p", "no:cacheprovider", f"packages/{dist}/tests",
                    *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """tests-integration/, with every package installed."""
    with _env_dropped_after(session):
        _install(session, list(FAMILIES.values()))
        session.run("pytest", "-q", "-p", "no:cacheprovider", "tests-integration",
                    *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Every family session, then the integration tests."""
    for fid in FAMILIES:
        session.notify(f"family({fid})")
    session.notify("integration")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on its embedded defaults."""
    with _env_dropped_after(session):
        _install(session, ["cake-tinylm"])
        session.run("cake-tinylm", "train", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
