"""cake-gqa-train: grouped-query attention (causal, windowed, soft-capped, packed or
batched) forward and backward in Triton, not promised bitwise repeatable: its plan may sum
dK and dV over a KV head's query heads by floating atomic adds (``bwd_atomic``; on CUDA the
rule runs cake-gqa-det-train's kernel, no slower there). The recorded exception to cake's
``det`` naming. flash-attn 2's
``flash_attn_func`` / ``flash_attn_varlen_func`` on top.

Public names are imported lazily (importing the package does not import Triton).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "gqa": "api",
    "gqa_fwd": "api",
    "gqa_bwd": "api",
    "flash_attn_func": "api",
    "flash_attn_varlen_func": "api",
    "GQAPlan": "plan",
    "make_plan": "plan",
    "GQASavedSet": "saved",
    "GQAWorkspace": "saved",
    "is_supported": "queries",
    "workspace_bytes": "queries",
    "saved_bytes": "queries",
}

__all__ = [
    "GQAPlan",
    "GQASavedSet",
    "GQAWorkspace",
    "__version__",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "gqa",
    "gqa_bwd",
    "gqa_fwd",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_gqa_train.api import flash_attn_func, flash_attn_varlen_func, gqa, gqa_bwd, gqa_fwd
    from cake_gqa_train.plan import GQAPlan, make_plan
    from cake_gqa_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_gqa_train.saved import GQASavedSet, GQAWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
