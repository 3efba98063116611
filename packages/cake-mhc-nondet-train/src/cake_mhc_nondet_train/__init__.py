"""cake-mhc-nondet-train: manifold-constrained hyper-connections (DeepSeek mHC,
arXiv:2512.24880) forward and backward in Triton, bits not promised: the nondet sibling of
cake-mhc-det-train.

n residual streams X ``[n, C]`` per token; a layer computes H_pre, H_post and a doubly
stochastic H_res from one fused projection of the RMS-normalized vec(X); the branch sees
U = sum_i H_pre[i] X[i] and the output is Y[j] = H_post[j] F(U) + sum_i H_res[j, i] X[i].
It runs cake-mhc-det-train's kernels today, with plans, saved sets and workspaces of mode
``nondet``; its backward raises under ``torch.use_deterministic_algorithms(True)``.

Public names are imported lazily: importing this package (or its ``cake_build`` manifest)
does not import Triton or the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cake_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "mhc_nondet_prepare": "api",
    "mhc_nondet_finish": "api",
    "HyperConnectionNondet": "modules",
    "MHCNondetPlan": "plan",
    "make_nondet_plan": "plan",
    "MHCNondetSavedSet": "saved",
    "MHCNondetWorkspace": "saved",
    "is_supported_nondet": "queries",
    "saved_bytes_nondet": "queries",
    "workspace_bytes_nondet": "queries",
}

__all__ = [
    "MHCNondetPlan",
    "MHCNondetSavedSet",
    "MHCNondetWorkspace",
    "HyperConnectionNondet",
    "__version__",
    "is_supported_nondet",
    "make_nondet_plan",
    "mhc_nondet_finish",
    "mhc_nondet_prepare",
    "saved_bytes_nondet",
    "workspace_bytes_nondet",
]

if TYPE_CHECKING:  # pragma: no cover
    from cake_mhc_nondet_train.api import mhc_nondet_finish, mhc_nondet_prepare
    from cake_mhc_nondet_train.modules import HyperConnectionNondet
    from cake_mhc_nondet_train.plan import MHCNondetPlan, make_nondet_plan
    from cake_mhc_nondet_train.queries import (
        is_supported_nondet,
        saved_bytes_nondet,
        workspace_bytes_nondet,
    )
    from cake_mhc_nondet_train.saved import MHCNondetSavedSet, MHCNondetWorkspace


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
