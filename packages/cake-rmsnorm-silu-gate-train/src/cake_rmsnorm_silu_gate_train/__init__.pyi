"""Type stub of the legacy name cake_rmsnorm_silu_gate_train.

``from cake_rmsnorm_silu_gate_train import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_rmsnorm_silu_gate_train import <old spelling>`` works); a star import does not bind it.
"""

from cake_rmsnorm_silu_gate_det_train import RMSNormGated as RMSNormGated
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetGrads as RMSNormSiluGateDetGrads
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetPlan as RMSNormSiluGateDetPlan
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetSavedSet as RMSNormSiluGateDetSavedSet,
)
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetWorkspace as RMSNormSiluGateDetWorkspace,
)
from cake_rmsnorm_silu_gate_det_train import __version__ as __version__
from cake_rmsnorm_silu_gate_det_train import is_supported as is_supported
from cake_rmsnorm_silu_gate_det_train import make_plan as make_plan
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det as rmsnorm_silu_gate_det
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_bwd as rmsnorm_silu_gate_det_bwd
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_fwd as rmsnorm_silu_gate_det_fwd
from cake_rmsnorm_silu_gate_det_train import (
    rmsnorm_silu_gate_reference as rmsnorm_silu_gate_reference,
)
from cake_rmsnorm_silu_gate_det_train import saved_bytes as saved_bytes
from cake_rmsnorm_silu_gate_det_train import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
RMSNormSiluGateGrads = RMSNormSiluGateDetGrads
RMSNormSiluGatePlan = RMSNormSiluGateDetPlan
RMSNormSiluGateSavedSet = RMSNormSiluGateDetSavedSet
RMSNormSiluGateWorkspace = RMSNormSiluGateDetWorkspace
rmsnorm_silu_gate = rmsnorm_silu_gate_det
rmsnorm_silu_gate_bwd = rmsnorm_silu_gate_det_bwd
rmsnorm_silu_gate_fwd = rmsnorm_silu_gate_det_fwd

__all__ = [
    "RMSNormGated",
    "RMSNormSiluGateDetGrads",
    "RMSNormSiluGateDetPlan",
    "RMSNormSiluGateDetSavedSet",
    "RMSNormSiluGateDetWorkspace",
    "__version__",
    "is_supported",
    "make_plan",
    "rmsnorm_silu_gate_det",
    "rmsnorm_silu_gate_det_bwd",
    "rmsnorm_silu_gate_det_fwd",
    "rmsnorm_silu_gate_reference",
    "saved_bytes",
    "workspace_bytes",
]
