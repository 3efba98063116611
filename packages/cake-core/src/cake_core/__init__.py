"""cake-core: the shared contract of cake's deterministic training kernels.

Importing this package is cheap: it does not import Triton. It applies the
CUDA-or-interpreter rule (:func:`cake_core.backend.select_backend`): without a CUDA device
and without ``TRITON_INTERPRET`` set, it sets ``TRITON_INTERPRET=1``. Triton helpers live in
:mod:`cake_core.triton_utils`, test helpers in :mod:`cake_core.testing`.
"""

from cake_core.backend import select_backend
from cake_core.checks import (
    check_accumulator,
    check_cu_seqlens,
    check_device,
    check_dtype,
    check_flag,
    check_float_dtype,
    check_int,
    check_last_dim_contiguous,
    check_ndim,
    check_positive_finite,
    check_same_device,
    check_shape,
    check_tensor,
)
from cake_core.mode import Mode, nondet_alert, require_mode
from cake_core.plan import Plan
from cake_core.saved import SavedSet
from cake_core.workspace import Workspace

__version__ = "0.1.0"

# the CUDA-or-interpreter rule, before anything imports Triton (torch.compile does): Triton
# reads TRITON_INTERPRET when it is first imported
select_backend()

__all__ = [
    "Mode",
    "Plan",
    "SavedSet",
    "Workspace",
    "__version__",
    "check_accumulator",
    "check_cu_seqlens",
    "check_device",
    "check_dtype",
    "check_flag",
    "check_float_dtype",
    "check_int",
    "check_last_dim_contiguous",
    "check_ndim",
    "check_positive_finite",
    "check_same_device",
    "check_shape",
    "check_tensor",
    "nondet_alert",
    "require_mode",
]
