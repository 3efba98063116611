"""cake-kda-nondet-train: chunked Kimi Delta Attention in Triton, bits not promised.

The non-deterministic sibling of cake-kda-det-train: the same math, arguments and errors
(Kimi Team, 2025, "Kimi Linear", arXiv:2510.26692; FLA's ``chunk_kda``) with its own
mode-carrying objects (:class:`KDANondetPlan`, :class:`KDANondetSavedSet`,
:class:`KDANondetWorkspace`, mode ``nondet``): :func:`chunk_kda_nondet` (autograd),
:func:`chunk_kda_nondet_fwd` and :func:`chunk_kda_nondet_bwd` (low level). It runs
cake-kda-det-train's kernels today; its bits are not promised. Under
``torch.use_deterministic_algorithms(True)`` its backward raises ``RuntimeError`` naming
``cake_kda_det_train.chunk_kda_det``.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_kda_nondet": "api",
    "chunk_kda_nondet_fwd": "api",
    "chunk_kda_nondet_bwd": "api",
    "KDANondetGrads": "api",
    "KDANondetPlan": "plan",
    "make_nondet_plan": "plan",
    "KDANondetSavedSet": "saved",
    "KDANondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "KDANondetGrads",
    "KDANondetPlan",
    "KDANondetSavedSet",
    "KDANondetWorkspace",
    "__version__",
    "chunk_kda_nondet",
    "chunk_kda_nondet_bwd",
    "chunk_kda_nondet_fwd",
    "is_supported_nondet",
    "make_nondet_plan",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_kda_nondet_train.api import (
        KDANondetGrads,
        chunk_kda_nondet,
        chunk_kda_nondet_bwd,
        chunk_kda_nondet_fwd,
    )
    from cake_kda_nondet_train.plan import KDANondetPlan, make_nondet_plan
    from cake_kda_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_kda_nondet_train.saved import KDANondetSavedSet, KDANondetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
