"""cake-causal-conv1d-nondet-train: causal depthwise conv1d, forward and backward, with bits
not promised repeatable (the non-deterministic sibling of cake-causal-conv1d-det-train).

y[t, c] = act(bias[c] + sum_{j<W} weight[c, j] * x[t - W + 1 + j, c]) within each sequence
(FLA's ``ShortConvolution``, Dao-AILab's ``causal_conv1d_fn``). Today it runs
cake-causal-conv1d-det-train's kernels and launches under its own plan, saved set,
workspace and custom ops (mode ``nondet``); its speed is the det sibling's.

Public names are imported lazily: importing this package (or its ``cake_build``
manifest) does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "causal_conv1d_nondet": "api",
    "causal_conv1d_nondet_fwd": "api",
    "causal_conv1d_nondet_bwd": "api",
    "CausalConv1dNondetGrads": "api",
    "ShortConvolutionNondet": "modules",
    "CausalConv1dNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "CausalConv1dNondetSavedSet": "saved",
    "CausalConv1dNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "workspace_bytes_nondet": "queries",
    "saved_bytes_nondet": "queries",
}

__all__ = [
    "CausalConv1dNondetGrads",
    "CausalConv1dNondetPlan",
    "CausalConv1dNondetSavedSet",
    "CausalConv1dNondetWorkspace",
    "ShortConvolutionNondet",
    "__version__",
    "causal_conv1d_nondet",
    "causal_conv1d_nondet_bwd",
    "causal_conv1d_nondet_fwd",
    "is_supported_nondet",
    "make_nondet_plan",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_causal_conv1d_nondet_train.api import (
        CausalConv1dNondetGrads,
        causal_conv1d_nondet,
        causal_conv1d_nondet_bwd,
        causal_conv1d_nondet_fwd,
    )
    from cake_causal_conv1d_nondet_train.modules import ShortConvolutionNondet
    from cake_causal_conv1d_nondet_train.plan import CausalConv1dNondetPlan, make_nondet_plan
    from cake_causal_conv1d_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_causal_conv1d_nondet_train.saved import (
        CausalConv1dNondetSavedSet,
        CausalConv1dNondetWorkspace,
    )


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
