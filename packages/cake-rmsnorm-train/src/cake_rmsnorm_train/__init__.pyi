"""Type stub of the legacy name cake_rmsnorm_train."""

from cake_rmsnorm_det_train import RMSNorm as RMSNorm
from cake_rmsnorm_det_train import RMSNormDetGrads as RMSNormDetGrads
from cake_rmsnorm_det_train import RMSNormDetGrads as RMSNormGrads
from cake_rmsnorm_det_train import RMSNormDetPlan as RMSNormDetPlan
from cake_rmsnorm_det_train import RMSNormDetPlan as RMSNormPlan
from cake_rmsnorm_det_train import RMSNormDetSavedSet as RMSNormDetSavedSet
from cake_rmsnorm_det_train import RMSNormDetSavedSet as RMSNormSavedSet
from cake_rmsnorm_det_train import RMSNormDetWorkspace as RMSNormDetWorkspace
from cake_rmsnorm_det_train import RMSNormDetWorkspace as RMSNormWorkspace
from cake_rmsnorm_det_train import __version__ as __version__
from cake_rmsnorm_det_train import make_plan as make_plan
from cake_rmsnorm_det_train import rmsnorm_det as rmsnorm
from cake_rmsnorm_det_train import rmsnorm_det as rmsnorm_det
from cake_rmsnorm_det_train import rmsnorm_det_bwd as rmsnorm_bwd
from cake_rmsnorm_det_train import rmsnorm_det_bwd as rmsnorm_det_bwd
from cake_rmsnorm_det_train import rmsnorm_det_fwd as rmsnorm_det_fwd
from cake_rmsnorm_det_train import rmsnorm_det_fwd as rmsnorm_fwd
from cake_rmsnorm_det_train import rmsnorm_reference as rmsnorm_reference

__all__ = [
    "RMSNorm",
    "RMSNormDetGrads",
    "RMSNormDetPlan",
    "RMSNormDetSavedSet",
    "RMSNormDetWorkspace",
    "RMSNormGrads",
    "RMSNormPlan",
    "RMSNormSavedSet",
    "RMSNormWorkspace",
    "__version__",
    "make_plan",
    "rmsnorm",
    "rmsnorm_bwd",
    "rmsnorm_det",
    "rmsnorm_det_bwd",
    "rmsnorm_det_fwd",
    "rmsnorm_fwd",
    "rmsnorm_reference",
]
