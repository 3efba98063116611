"""Type stub of the legacy name cake_rmsnorm_train.

``from cake_rmsnorm_train import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_rmsnorm_train import <old spelling>`` works); a star import does not bind it.
"""

from cake_rmsnorm_det_train import RMSNorm as RMSNorm
from cake_rmsnorm_det_train import RMSNormDetGrads as RMSNormDetGrads
from cake_rmsnorm_det_train import RMSNormDetPlan as RMSNormDetPlan
from cake_rmsnorm_det_train import RMSNormDetSavedSet as RMSNormDetSavedSet
from cake_rmsnorm_det_train import RMSNormDetWorkspace as RMSNormDetWorkspace
from cake_rmsnorm_det_train import __version__ as __version__
from cake_rmsnorm_det_train import is_supported as is_supported
from cake_rmsnorm_det_train import make_plan as make_plan
from cake_rmsnorm_det_train import rmsnorm_det as rmsnorm_det
from cake_rmsnorm_det_train import rmsnorm_det_bwd as rmsnorm_det_bwd
from cake_rmsnorm_det_train import rmsnorm_det_fwd as rmsnorm_det_fwd
from cake_rmsnorm_det_train import rmsnorm_reference as rmsnorm_reference
from cake_rmsnorm_det_train import saved_bytes as saved_bytes
from cake_rmsnorm_det_train import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
RMSNormGrads = RMSNormDetGrads
RMSNormPlan = RMSNormDetPlan
RMSNormSavedSet = RMSNormDetSavedSet
RMSNormWorkspace = RMSNormDetWorkspace
rmsnorm = rmsnorm_det
rmsnorm_bwd = rmsnorm_det_bwd
rmsnorm_fwd = rmsnorm_det_fwd

__all__ = [
    "RMSNorm",
    "RMSNormDetGrads",
    "RMSNormDetPlan",
    "RMSNormDetSavedSet",
    "RMSNormDetWorkspace",
    "__version__",
    "is_supported",
    "make_plan",
    "rmsnorm_det",
    "rmsnorm_det_bwd",
    "rmsnorm_det_fwd",
    "rmsnorm_reference",
    "saved_bytes",
    "workspace_bytes",
]
