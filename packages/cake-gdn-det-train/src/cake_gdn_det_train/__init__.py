"""cake-gdn-det-train: deterministic chunked Gated DeltaNet in Triton.

Per sequence and value head, with state S ``[K, V]`` (Yang, Kautz & Hatamizadeh, 2024,
"Gated Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464), for each token::

    S <- exp(g_t) * S
    S <- S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = scale * S^T q_t

computed chunk by chunk (64 tokens, WY/UT form) like FLA's ``chunk_gated_delta_rule``:
:func:`chunk_gated_delta_rule_det` (autograd), :func:`chunk_gdn_det_fwd` and
:func:`chunk_gdn_det_bwd` (low level).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_gated_delta_rule_det": "api",
    "chunk_gdn_det_fwd": "api",
    "chunk_gdn_det_bwd": "api",
    "GDNDetGrads": "api",
    "GDNDetPlan": "plan",
    "make_plan": "plan",
    "GDNDetSavedSet": "saved",
    "GDNDetWorkspace": "saved",
    "gdn_reference": "reference",
    "GatedDeltaNet": "layers",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "GDNDetGrads",
    "GDNDetPlan",
    "GDNDetSavedSet",
    "GDNDetWorkspace",
    "GatedDeltaNet",
    "__version__",
    "chunk_gated_delta_rule_det",
    "chunk_gdn_det_bwd",
    "chunk_gdn_det_fwd",
    "gdn_reference",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gdn_det_train.api import (
        GDNDetGrads,
        chunk_gated_delta_rule_det,
        chunk_gdn_det_bwd,
        chunk_gdn_det_fwd,
    )
    from cake_gdn_det_train.layers import GatedDeltaNet
    from cake_gdn_det_train.plan import GDNDetPlan, make_plan
    from cake_gdn_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_gdn_det_train.reference import gdn_reference
    from cake_gdn_det_train.saved import GDNDetSavedSet, GDNDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
