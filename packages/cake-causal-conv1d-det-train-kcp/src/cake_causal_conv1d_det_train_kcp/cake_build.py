"""Build manifest of cake-causal-conv1d-det-train-kcp (plain data; format in cake_core.build).

A ``-kcp`` family ships no kernels of its own: each rank launches its local sibling's.
``reuses`` is that sibling registry (distribution, import name, version range, the entries
called); ``kernels`` lists the sibling's kernels a call launches (read from the sibling's
own manifest); ``source_digest`` covers the sibling's kernel digest and this package's
halo plan, exchange and entry modules (the order of the halo-gradient and weight-gradient
sums fixes the bits)."""

import hashlib
from pathlib import Path

FAMILY = {
    "name": "cake-causal-conv1d-det-train-kcp",
    "import_name": "cake_causal_conv1d_det_train_kcp",
    "version": "0.1.0",
    "mode": "det",
    "kind": "kcp",
    "entry_points": ["causal_conv1d_det_kcp", "causal_conv1d_det_fwd_kcp",
                     "causal_conv1d_det_bwd_kcp", "partition_det_kcp", "build_context_det_kcp"],
}

#: the local sibling whose kernels every rank runs
REUSES = [
    {"name": "cake-causal-conv1d-det-train", "import_name": "cake_causal_conv1d_det_train",
     "version_range": ">=0.1,<0.2",
     "entry_points": ["causal_conv1d_det_fwd", "causal_conv1d_det_bwd", "make_plan"]},
]

#: this package's modules whose code fixes the bits (halo plan, exchange and sum orders)
DIGESTED = ("api.py", "exchange.py", "context.py")


def _sibling():
    from cake_causal_conv1d_det_train import cake_build

    return cake_build


MANIFEST = {
    **FAMILY,
    "kernels": [],  # filled from the sibling by manifest()
    "plans": ["CausalConv1dDetPlan"],
    "package_data": [],
    "reuses": REUSES,
}


def manifest() -> dict:
    """The manifest with the sibling's kernels and the digest filled in: sha256 over the
    sibling's ``source_digest`` and this package's :data:`DIGESTED` modules."""
    sib = _sibling().manifest()
    h = hashlib.sha256(sib["source_digest"].encode() + b"\0")
    here = Path(__file__).parent
    for name in DIGESTED:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return {**MANIFEST, "kernels": list(sib["kernels"]), "source_digest": "sha256:" + h.hexdigest()}
