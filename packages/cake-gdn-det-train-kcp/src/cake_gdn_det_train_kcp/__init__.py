"""cake-gdn-det-train-kcp: context-parallel (KCP) deterministic chunked Gated DeltaNet.

One packed batch of documents is split over the ranks of a process group
(:func:`partition_det_kcp`, :func:`build_context_det_kcp`); each rank runs
cake-gdn-det-train's single-rank kernels on its own tokens and the ranks exchange the
fp32 recurrent states (or affine summaries of them) that cross their cuts:
:func:`chunk_gated_delta_rule_det_kcp` (autograd), :func:`chunk_gdn_det_fwd_kcp` and
:func:`chunk_gdn_det_bwd_kcp` (low level). Bitwise repeatable for a fixed partition,
exchange and plan; ``docs/kcp.md`` has the algorithm and what det promises across
partitions.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_gated_delta_rule_det_kcp": "api",
    "chunk_gdn_det_fwd_kcp": "api",
    "chunk_gdn_det_bwd_kcp": "api",
    "GDNDetKCPGrads": "api",
    "partition_det_kcp": "context",
    "build_context_det_kcp": "context",
    "comm_bytes": "context",
    "GDNDetKCPSavedSet": "saved",
    "GDNDetKCPWorkspace": "saved",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "GDNDetKCPGrads",
    "GDNDetKCPSavedSet",
    "GDNDetKCPWorkspace",
    "__version__",
    "build_context_det_kcp",
    "chunk_gated_delta_rule_det_kcp",
    "chunk_gdn_det_bwd_kcp",
    "chunk_gdn_det_fwd_kcp",
    "comm_bytes",
    "is_supported",
    "partition_det_kcp",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gdn_det_train_kcp.api import (
        GDNDetKCPGrads,
        chunk_gated_delta_rule_det_kcp,
        chunk_gdn_det_bwd_kcp,
        chunk_gdn_det_fwd_kcp,
    )
    from cake_gdn_det_train_kcp.context import (
        build_context_det_kcp,
        comm_bytes,
        partition_det_kcp,
    )
    from cake_gdn_det_train_kcp.queries import is_supported, saved_bytes, workspace_bytes
    from cake_gdn_det_train_kcp.saved import GDNDetKCPSavedSet, GDNDetKCPWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
