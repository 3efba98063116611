"""cake-transformers: train Hugging Face transformers models on cake's deterministic kernels.

``apply_cake_kernels_to_qwen3_next(model)`` swaps the compute of a Qwen3-Next model
(RMSNorms, Gated DeltaNet, short convolution, gated norm, gated attention, sparse MoE, LM
head with its loss) for cake's det kernels in place, keeping its parameters and
``state_dict`` keys; without a model it patches transformers' Qwen3-Next classes, so every
model of them (built before or after) uses cake. ``apply_cake_kernels_to_qwen3`` and
``apply_cake_kernels_to_llama`` do the same for the dense decoders (RMSNorms, attention,
SwiGLU MLP projections, LM head with its loss).

Public names are imported lazily: importing this package does not import transformers,
Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "apply_cake_kernels_to_qwen3": "dense",
    "apply_cake_kernels_to_llama": "dense",
    "DENSE_PIECES": "dense",
    "apply_cake_kernels_to_qwen3_next": "qwen3_next",
    "QWEN3_NEXT_PIECES": "qwen3_next",
}

__all__ = [
    "DENSE_PIECES",
    "QWEN3_NEXT_PIECES",
    "__version__",
    "apply_cake_kernels_to_llama",
    "apply_cake_kernels_to_qwen3",
    "apply_cake_kernels_to_qwen3_next",
]
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)

if TYPE_CHECKING:
    from cake_transformers.dense import (  # noqa: F401
        DENSE_PIECES,
        apply_cake_kernels_to_llama,
        apply_cake_kernels_to_qwen3,
    )
    from cake_transformers.qwen3_next import (  # noqa: F401
        QWEN3_NEXT_PIECES,
        apply_cake_kernels_to_qwen3_next,
    )
