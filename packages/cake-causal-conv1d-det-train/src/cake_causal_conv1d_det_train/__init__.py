"""cake-causal-conv1d-det-train: deterministic causal depthwise conv1d, forward and backward.

y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c]) within each sequence,
the short convolution of Mamba / DeltaNet / GDN layers (semantics of Dao-AILab's
``causal_conv1d_fn`` and FLA's ``ShortConvolution``), in Triton, with a bitwise repeatable
backward (dweight and dbias summed in a fixed order, no atomics).

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "causal_conv1d_det": "api",
    "causal_conv1d_det_fwd": "api",
    "causal_conv1d_det_bwd": "api",
    "CausalConv1dDetGrads": "api",
    "ShortConvolution": "modules",
    "CausalConv1dDetPlan": "plan",
    "make_plan": "plan",
    "CausalConv1dDetSavedSet": "saved",
    "CausalConv1dDetWorkspace": "saved",
    "causal_conv1d_reference": "reference",
    "is_supported": "queries",
    "workspace_bytes": "queries",
    "saved_bytes": "queries",
}

__all__ = [
    "CausalConv1dDetGrads",
    "CausalConv1dDetPlan",
    "CausalConv1dDetSavedSet",
    "CausalConv1dDetWorkspace",
    "ShortConvolution",
    "__version__",
    "causal_conv1d_det",
    "causal_conv1d_det_bwd",
    "causal_conv1d_det_fwd",
    "causal_conv1d_reference",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_causal_conv1d_det_train.api import (
        CausalConv1dDetGrads,
        causal_conv1d_det,
        causal_conv1d_det_bwd,
        causal_conv1d_det_fwd,
    )
    from cake_causal_conv1d_det_train.modules import ShortConvolution
    from cake_causal_conv1d_det_train.plan import CausalConv1dDetPlan, make_plan
    from cake_causal_conv1d_det_train.queries import (
        is_supported,
        saved_bytes,
        workspace_bytes,
    )
    from cake_causal_conv1d_det_train.reference import causal_conv1d_reference
    from cake_causal_conv1d_det_train.saved import (
        CausalConv1dDetSavedSet,
        CausalConv1dDetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
