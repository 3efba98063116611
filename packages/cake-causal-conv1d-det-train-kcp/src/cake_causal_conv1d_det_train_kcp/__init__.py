"""cake-causal-conv1d-det-train-kcp: context-parallel (KCP) deterministic causal depthwise
conv1d.

One packed batch of documents is split over the ranks of a process group
(:func:`partition_det_kcp`, :func:`build_context_det_kcp`); each rank runs
cake-causal-conv1d-det-train's single-rank kernels on its own tokens, with the ``W - 1``
input rows just before each of its document pieces (the *halo*, gathered from the ranks
that hold them) as the local call's ``initial_state``; the backward returns the halo's
gradient (the local call's ``dinitial_state``) to those ranks. Entries:
:func:`causal_conv1d_det_kcp` (autograd), :func:`causal_conv1d_det_fwd_kcp` and
:func:`causal_conv1d_det_bwd_kcp` (low level). Bitwise repeatable for a fixed partition
and plan; ``docs/kcp.md`` has the algorithm and what det promises across partitions.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "causal_conv1d_det_kcp": "api",
    "causal_conv1d_det_fwd_kcp": "api",
    "causal_conv1d_det_bwd_kcp": "api",
    "CausalConv1dDetKCPGrads": "api",
    "partition_det_kcp": "context",
    "build_context_det_kcp": "context",
    "comm_bytes": "context",
    "CausalConv1dDetKCPSavedSet": "saved",
    "CausalConv1dDetKCPWorkspace": "saved",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "CausalConv1dDetKCPGrads",
    "CausalConv1dDetKCPSavedSet",
    "CausalConv1dDetKCPWorkspace",
    "__version__",
    "build_context_det_kcp",
    "causal_conv1d_det_bwd_kcp",
    "causal_conv1d_det_fwd_kcp",
    "causal_conv1d_det_kcp",
    "comm_bytes",
    "is_supported",
    "partition_det_kcp",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_causal_conv1d_det_train_kcp.api import (
        CausalConv1dDetKCPGrads,
        causal_conv1d_det_bwd_kcp,
        causal_conv1d_det_fwd_kcp,
        causal_conv1d_det_kcp,
    )
    from cake_causal_conv1d_det_train_kcp.context import (
        build_context_det_kcp,
        comm_bytes,
        partition_det_kcp,
    )
    from cake_causal_conv1d_det_train_kcp.queries import (
        is_supported,
        saved_bytes,
        workspace_bytes,
    )
    from cake_causal_conv1d_det_train_kcp.saved import (
        CausalConv1dDetKCPSavedSet,
        CausalConv1dDetKCPWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
