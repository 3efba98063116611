"""cake-kda-nondet-train-kcp: context-parallel (KCP) chunked Kimi Delta Attention, bits not
promised.

The non-deterministic sibling of cake-kda-det-train-kcp: one packed batch of documents is
split over the ranks of a process group (:func:`partition_nondet_kcp`,
:func:`build_context_nondet_kcp`); each rank runs cake-kda-nondet-train's single-rank
entries on its own tokens and the ranks exchange the fp32 recurrent states (or affine
summaries of them) that cross their cuts, by cake-kda-det-train-kcp's exchange and folds:
:func:`chunk_kda_nondet_kcp` (autograd), :func:`chunk_kda_nondet_fwd_kcp` and
:func:`chunk_kda_nondet_bwd_kcp` (low level). It runs cake-kda-det-train's kernels today;
its bits are not promised. Its objects carry mode ``nondet``
(:class:`KDANondetKCPSavedSet`, :class:`KDANondetKCPWorkspace`, plans
``cake_kda_nondet_train.KDANondetPlan``).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_kda_nondet_kcp": "api",
    "chunk_kda_nondet_fwd_kcp": "api",
    "chunk_kda_nondet_bwd_kcp": "api",
    "KDANondetKCPGrads": "api",
    "partition_nondet_kcp": "context",
    "build_context_nondet_kcp": "context",
    "comm_bytes_nondet": "context",
    "KDANondetKCPSavedSet": "saved",
    "KDANondetKCPWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "KDANondetKCPGrads",
    "KDANondetKCPSavedSet",
    "KDANondetKCPWorkspace",
    "__version__",
    "build_context_nondet_kcp",
    "chunk_kda_nondet_bwd_kcp",
    "chunk_kda_nondet_fwd_kcp",
    "chunk_kda_nondet_kcp",
    "comm_bytes_nondet",
    "is_supported_nondet",
    "partition_nondet_kcp",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_kda_nondet_train_kcp.api import (
        KDANondetKCPGrads,
        chunk_kda_nondet_bwd_kcp,
        chunk_kda_nondet_fwd_kcp,
        chunk_kda_nondet_kcp,
    )
    from cake_kda_nondet_train_kcp.context import (
        build_context_nondet_kcp,
        comm_bytes_nondet,
        partition_nondet_kcp,
    )
    from cake_kda_nondet_train_kcp.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_kda_nondet_train_kcp.saved import KDANondetKCPSavedSet, KDANondetKCPWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
