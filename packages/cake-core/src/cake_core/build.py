"""The build manifest format every package's ``cake_build`` module follows.

Plain data only, so a checker can validate manifests across packages without importing
kernels. A manifest is a dict::

    {
      "name": "cake-rmsnorm-det-train", "import_name": "cake_rmsnorm_det_train",
      "version": "0.1.0", "mode": "det", "kind": "local",
      "entry_points": ["rmsnorm_det", ...],
      "kernels": [{"module": "cake_rmsnorm_det_train.kernels.fwd", "function": "..."}],
      "plans": ["RMSNormDetPlan"],
      "package_data": [],
      "source_digest": "sha256:...",   # over the kernel modules' source files
    }
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST_KEYS = ("name", "import_name", "version", "mode", "kind", "entry_points", "kernels",
                 "plans", "package_data", "source_digest")


def source_digest(package_dir: str | Path, subdir: str = "kernels") -> str:
    """sha256 over the sorted ``*.py`` files under ``package_dir/subdir`` (paths and
    bytes), stable across machines."""
    root = Path(package_dir) / subdir
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def kernel_digest(package_dir: str | Path, core_modules: tuple[str, ...] = ()) -> str:
    """The ``source_digest`` of a family that also launches cake-core kernels: with no
    ``core_modules``, :func:`source_digest` of ``package_dir`` itself; otherwise
    ``"sha256:" + sha256(source_digest + NUL + each module's source bytes + NUL, in the
    given order)``. The modules (e.g. ``"cake_core.l2norm"``) are found with
    :func:`importlib.util.find_spec`, not imported, so a manifest imports no Triton."""
    own = source_digest(package_dir)
    if not core_modules:
        return own
    import importlib.util

    h = hashlib.sha256(own.encode() + b"\0")
    for mod in core_modules:
        h.update(Path(importlib.util.find_spec(mod).origin).read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def validate_manifest(m: dict) -> list[str]:
    """Problems with a manifest's shape (empty list when it is well formed)."""
    problems = [f"missing key {k!r}" for k in MANIFEST_KEYS if k not in m]
    for k in m.get("kernels", []):
        if not isinstance(k, dict) or set(k) != {"module", "function"}:
            problems.append(f"kernel entry {k!r} must be {{'module', 'function'}}")
    return problems
