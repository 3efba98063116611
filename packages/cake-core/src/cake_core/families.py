"""Discovery of installed cake families through the ``cake.families`` entry-point group.

Each distribution declares one entry point, ``<canonical-name> = <pkg>.cake_build:FAMILY``,
whose target is a plain dict. Package ``__init__`` modules import their kernels lazily, so
listing families imports neither Triton nor any kernel module.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import entry_points

GROUP = "cake.families"


@dataclasses.dataclass(frozen=True)
class FamilyInfo:
    """What a family declares about itself."""

    name: str           # canonical distribution name, e.g. "cake-rmsnorm-det-train"
    import_name: str    # e.g. "cake_rmsnorm_det_train"
    mode: str           # "det", "nondet" or "none" (not a kernel family)
    kind: str           # "local", "kcp" or "tool"
    entry_points: tuple[str, ...]  # public callables / classes
    version: str


def family_info(d: dict) -> FamilyInfo:
    """Build a :class:`FamilyInfo` from a ``cake_build.FAMILY`` dict (``ValueError`` if
    a key is missing)."""
    try:
        return FamilyInfo(name=d["name"], import_name=d["import_name"], mode=d["mode"],
                          kind=d["kind"], entry_points=tuple(d["entry_points"]),
                          version=d["version"])
    except KeyError as e:
        raise ValueError(f"family declaration lacks key {e}") from None


def list_families() -> list[FamilyInfo]:
    """Installed families, sorted by name (reads only each package's ``cake_build``)."""
    out = []
    for ep in entry_points(group=GROUP):
        out.append(family_info(ep.load()))
    return sorted(out, key=lambda f: f.name)
