"""Build manifest of cake-kda-det-train-kcp (plain data; format in cake_core.build).

A ``-kcp`` family ships no kernels of its own: each rank launches its local sibling's
(cake-kda-det-train). ``REUSES`` is that sibling registry, machine-readable: the
distribution, import name and version range of the sibling, the entries this package
calls, and the sibling's kernels a call launches (``kernels``: read from the sibling's own
manifest by :func:`manifest`). ``source_digest`` covers the sibling's kernel digest and
this package's exchange, fold and entry modules (their order fixes the bits).

Importing this module imports neither Triton nor the sibling (only :func:`manifest`
reads the sibling's ``cake_build``, which imports no Triton either)."""

import hashlib
from pathlib import Path

FAMILY = {
    "name": "cake-kda-det-train-kcp",
    "import_name": "cake_kda_det_train_kcp",
    "version": "0.1.0",
    "mode": "det",
    "kind": "kcp",
    "entry_points": ["chunk_kda_det_kcp", "chunk_kda_det_fwd_kcp", "chunk_kda_det_bwd_kcp",
                     "partition_det_kcp", "build_context_det_kcp"],
}

#: the local sibling whose kernels every rank runs: which of its entries are called (each
#: single-rank forward / backward of a group of fragments, the transition run for P, the
#: plan rule, the workspace) and the version range this package was written against
REUSES = [
    {"name": "cake-kda-det-train", "import_name": "cake_kda_det_train",
     "version_range": ">=0.1,<0.2",
     "entry_points": ["chunk_kda_det_fwd", "chunk_kda_det_bwd", "make_plan", "KDADetPlan",
                      "KDADetSavedSet", "KDADetWorkspace"]},
]

#: this package's modules whose code fixes the bits (the exchange and the fold order)
DIGESTED = ("api.py", "exchange.py", "context.py")


def _sibling():
    from cake_kda_det_train import cake_build

    return cake_build


MANIFEST = {
    **FAMILY,
    "kernels": [],  # filled from the sibling by manifest()
    "plans": ["KDADetPlan"],
    "package_data": [],
    "reuses": REUSES,
}


def manifest() -> dict:
    """The manifest with the sibling's kernels and the digest filled in: sha256 over the
    sibling's ``source_digest`` and this package's :data:`DIGESTED` modules (path, NUL,
    bytes, NUL each)."""
    sib = _sibling().manifest()
    h = hashlib.sha256(sib["source_digest"].encode() + b"\0")
    here = Path(__file__).parent
    for name in DIGESTED:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return {**MANIFEST, "kernels": list(sib["kernels"]),
            "source_digest": "sha256:" + h.hexdigest()}
