"""cake-mhc-det-train: deterministic manifold-constrained hyper-connections (DeepSeek mHC,
arXiv:2512.24880, 2025) forward and backward in Triton.

n residual streams X ``[n, C]`` per token; a layer computes, from one fused projection of
the RMS-normalized vec(X), H_pre = sigmoid(.), H_post = 2 sigmoid(.) and a doubly
stochastic H_res = Sinkhorn-Knopp(exp(.)); the branch sees U = sum_i H_pre[i] X[i] and the
output is Y[j] = H_post[j] F(U) + sum_i H_res[j, i] X[i].

Public names are imported lazily: importing this package (or its ``cake_build`` manifest)
does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "mhc_det_prepare": "api",
    "mhc_det_finish": "api",
    "HyperConnection": "modules",
    "expand_streams": "modules",
    "collapse_streams": "modules",
    "MHCDetPlan": "plan",
    "make_plan": "plan",
    "MHCDetSavedSet": "saved",
    "MHCDetWorkspace": "saved",
    "mhc_reference": "reference",
    "mhc_coefficients_reference": "reference",
    "is_supported": "queries",
    "saved_bytes": "queries",
    "workspace_bytes": "queries",
}

__all__ = [
    "HyperConnection",
    "MHCDetPlan",
    "MHCDetSavedSet",
    "MHCDetWorkspace",
    "__version__",
    "collapse_streams",
    "expand_streams",
    "is_supported",
    "make_plan",
    "mhc_coefficients_reference",
    "mhc_det_finish",
    "mhc_det_prepare",
    "mhc_reference",
    "saved_bytes",
    "workspace_bytes",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_mhc_det_train.api import mhc_det_finish, mhc_det_prepare
    from cake_mhc_det_train.modules import HyperConnection, collapse_streams, expand_streams
    from cake_mhc_det_train.plan import MHCDetPlan, make_plan
    from cake_mhc_det_train.queries import is_supported, saved_bytes, workspace_bytes
    from cake_mhc_det_train.reference import mhc_coefficients_reference, mhc_reference
    from cake_mhc_det_train.saved import MHCDetSavedSet, MHCDetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
