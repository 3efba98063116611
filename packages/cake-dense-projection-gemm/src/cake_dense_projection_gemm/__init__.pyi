"""Type stub of the legacy name cake_dense_projection_gemm.

``from cake_dense_projection_gemm import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_dense_projection_gemm import <old spelling>`` works); a star import does not bind it.
"""

from cake_dense_projection_det_gemm import DenseProjectionDetGrads as DenseProjectionDetGrads
from cake_dense_projection_det_gemm import DenseProjectionDetPlan as DenseProjectionDetPlan
from cake_dense_projection_det_gemm import DenseProjectionDetSavedSet as DenseProjectionDetSavedSet
from cake_dense_projection_det_gemm import (
    DenseProjectionDetWorkspace as DenseProjectionDetWorkspace,
)
from cake_dense_projection_det_gemm import Linear as Linear
from cake_dense_projection_det_gemm import __version__ as __version__
from cake_dense_projection_det_gemm import dense_projection_det as dense_projection_det
from cake_dense_projection_det_gemm import dense_projection_det_bwd as dense_projection_det_bwd
from cake_dense_projection_det_gemm import dense_projection_det_fwd as dense_projection_det_fwd
from cake_dense_projection_det_gemm import dense_projection_reference as dense_projection_reference
from cake_dense_projection_det_gemm import is_supported as is_supported
from cake_dense_projection_det_gemm import make_plan as make_plan
from cake_dense_projection_det_gemm import saved_bytes as saved_bytes
from cake_dense_projection_det_gemm import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
DenseProjectionGrads = DenseProjectionDetGrads
DenseProjectionPlan = DenseProjectionDetPlan
DenseProjectionSavedSet = DenseProjectionDetSavedSet
DenseProjectionWorkspace = DenseProjectionDetWorkspace
dense_projection = dense_projection_det
dense_projection_bwd = dense_projection_det_bwd
dense_projection_fwd = dense_projection_det_fwd

__all__ = [
    "DenseProjectionDetGrads",
    "DenseProjectionDetPlan",
    "DenseProjectionDetSavedSet",
    "DenseProjectionDetWorkspace",
    "Linear",
    "__version__",
    "dense_projection_det",
    "dense_projection_det_bwd",
    "dense_projection_det_fwd",
    "dense_projection_reference",
    "is_supported",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]
