"""cake-gdn-nondet-train-kcp: context-parallel (KCP) non-deterministic chunked Gated
DeltaNet.

cake-gdn-det-train-kcp's route (partitions, the all-gather and ring exchanges, the folds:
``docs/kcp.md``) with cake-gdn-nondet-train's single-rank entries on each rank and this
package's own types (mode ``nondet``): :func:`chunk_gated_delta_rule_nondet_kcp`
(autograd), :func:`chunk_gdn_nondet_fwd_kcp` and :func:`chunk_gdn_nondet_bwd_kcp` (low
level), :func:`partition_nondet_kcp`, :func:`build_context_nondet_kcp`. Today the kernels
are cake-gdn-det-train's (its speed); the bits are not promised.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_gated_delta_rule_nondet_kcp": "api",
    "chunk_gdn_nondet_fwd_kcp": "api",
    "chunk_gdn_nondet_bwd_kcp": "api",
    "GDNNondetKCPGrads": "api",
    "partition_nondet_kcp": "context",
    "build_context_nondet_kcp": "context",
    "comm_bytes_nondet": "context",
    "GDNNondetKCPSavedSet": "saved",
    "GDNNondetKCPWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "GDNNondetKCPGrads",
    "GDNNondetKCPSavedSet",
    "GDNNondetKCPWorkspace",
    "__version__",
    "build_context_nondet_kcp",
    "chunk_gated_delta_rule_nondet_kcp",
    "chunk_gdn_nondet_bwd_kcp",
    "chunk_gdn_nondet_fwd_kcp",
    "comm_bytes_nondet",
    "is_supported_nondet",
    "partition_nondet_kcp",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gdn_nondet_train_kcp.api import (
        GDNNondetKCPGrads,
        chunk_gated_delta_rule_nondet_kcp,
        chunk_gdn_nondet_bwd_kcp,
        chunk_gdn_nondet_fwd_kcp,
    )
    from cake_gdn_nondet_train_kcp.context import (
        build_context_nondet_kcp,
        comm_bytes_nondet,
        partition_nondet_kcp,
    )
    from cake_gdn_nondet_train_kcp.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_gdn_nondet_train_kcp.saved import GDNNondetKCPSavedSet, GDNNondetKCPWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
