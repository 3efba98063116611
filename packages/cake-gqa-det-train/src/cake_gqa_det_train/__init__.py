"""cake-gqa-det-train: deterministic grouped-query attention (causal, windowed, soft-capped,
packed or batched) forward and backward in Triton, with bitwise repeatable gradients, and
flash-attn 2's ``flash_attn_func`` / ``flash_attn_varlen_func`` on top.

Public names are imported lazily: importing this package (or its ``cake_build`` manifest)
does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "gqa_det": "api",
    "gqa_det_fwd": "api",
    "gqa_det_bwd": "api",
    "flash_attn_func": "api",
    "flash_attn_varlen_func": "api",
    "GQADetPlan": "plan",
    "make_plan": "plan",
    "HEAD_DIMS": "plan",
    "GQADetSavedSet": "saved",
    "GQADetWorkspace": "saved",
    "gqa_reference": "reference",
    "is_supported": "queries",
    "workspace_bytes": "queries",
    "saved_bytes": "queries",
}

__all__ = [
    "HEAD_DIMS",
    "GQADetPlan",
    "GQADetSavedSet",
    "GQADetWorkspace",
    "__version__",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "gqa_det",
    "gqa_det_bwd",
    "gqa_det_fwd",
    "gqa_reference",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gqa_det_train.api import (
        flash_attn_func,
        flash_attn_varlen_func,
        gqa_det,
        gqa_det_bwd,
        gqa_det_fwd,
    )
    from cake_gqa_det_train.plan import HEAD_DIMS, GQADetPlan, make_plan
    from cake_gqa_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_gqa_det_train.reference import gqa_reference
    from cake_gqa_det_train.saved import GQADetSavedSet, GQADetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
