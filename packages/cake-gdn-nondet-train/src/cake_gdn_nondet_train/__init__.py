"""cake-gdn-nondet-train: non-deterministic chunked Gated DeltaNet in Triton.

The math, shapes, dtypes and errors of cake-gdn-det-train (FLA's
``chunk_gated_delta_rule``; Yang, Kautz & Hatamizadeh, 2024, arXiv:2412.06464), in the
``nondet`` mode: :func:`chunk_gated_delta_rule_nondet` (autograd),
:func:`chunk_gdn_nondet_fwd` and :func:`chunk_gdn_nondet_bwd` (low level), with this
package's own plans, saved sets, workspaces and custom ops (``cake_gdn_nondet_train::``).
Today it runs cake-gdn-det-train's kernels (so its speed is the det sibling's); its bits
are not promised. Under ``torch.use_deterministic_algorithms(True)`` its backward raises
``RuntimeError`` naming ``cake_gdn_det_train.chunk_gated_delta_rule_det``.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_gated_delta_rule_nondet": "api",
    "chunk_gdn_nondet_fwd": "api",
    "chunk_gdn_nondet_bwd": "api",
    "GDNNondetGrads": "api",
    "GDNNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "GDNNondetSavedSet": "saved",
    "GDNNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "GDNNondetGrads",
    "GDNNondetPlan",
    "GDNNondetSavedSet",
    "GDNNondetWorkspace",
    "__version__",
    "chunk_gated_delta_rule_nondet",
    "chunk_gdn_nondet_bwd",
    "chunk_gdn_nondet_fwd",
    "is_supported_nondet",
    "make_nondet_plan",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gdn_nondet_train.api import (
        GDNNondetGrads,
        chunk_gated_delta_rule_nondet,
        chunk_gdn_nondet_bwd,
        chunk_gdn_nondet_fwd,
    )
    from cake_gdn_nondet_train.plan import GDNNondetPlan, make_nondet_plan
    from cake_gdn_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_gdn_nondet_train.saved import GDNNondetSavedSet, GDNNondetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
