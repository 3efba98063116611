"""cake-kda-det-train: deterministic chunked Kimi Delta Attention in Triton.

Per sequence and value head, with state S ``[K, V]`` and a per-channel log decay g_t
``[K]`` (Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture",
arXiv:2510.26692), for each token::

    S <- diag(exp(g_t)) S
    S <- S + beta_t * k_t (v_t - S^T k_t)^T
    o_t = scale * S^T q_t

computed chunk by chunk (64 tokens, WY/UT form) like FLA's ``chunk_kda``:
:func:`chunk_kda_det` (autograd), :func:`chunk_kda_det_fwd` and :func:`chunk_kda_det_bwd`
(low level).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "chunk_kda_det": "api",
    "chunk_kda_det_fwd": "api",
    "chunk_kda_det_bwd": "api",
    "KDADetGrads": "api",
    "KDADetPlan": "plan",
    "make_plan": "plan",
    "KDADetSavedSet": "saved",
    "KDADetWorkspace": "saved",
    "kda_recurrence_ref": "reference",
    "kda_gate_ref": "reference",
    "KimiDeltaAttention": "layers",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "KDADetGrads",
    "KDADetPlan",
    "KDADetSavedSet",
    "KDADetWorkspace",
    "KimiDeltaAttention",
    "__version__",
    "chunk_kda_det",
    "chunk_kda_det_bwd",
    "chunk_kda_det_fwd",
    "is_supported",
    "kda_gate_ref",
    "kda_recurrence_ref",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_kda_det_train.api import (
        KDADetGrads,
        chunk_kda_det,
        chunk_kda_det_bwd,
        chunk_kda_det_fwd,
    )
    from cake_kda_det_train.layers import KimiDeltaAttention
    from cake_kda_det_train.plan import KDADetPlan, make_plan
    from cake_kda_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_kda_det_train.reference import kda_gate_ref, kda_recurrence_ref
    from cake_kda_det_train.saved import KDADetSavedSet, KDADetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
