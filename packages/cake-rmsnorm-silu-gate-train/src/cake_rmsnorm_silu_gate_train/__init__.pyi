"""Type stub of the legacy name cake_rmsnorm_silu_gate_train."""

from cake_rmsnorm_silu_gate_det_train import RMSNormGated as RMSNormGated
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetGrads as RMSNormSiluGateDetGrads
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetGrads as RMSNormSiluGateGrads
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetPlan as RMSNormSiluGateDetPlan
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetPlan as RMSNormSiluGatePlan
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetSavedSet as RMSNormSiluGateDetSavedSet,
)
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetSavedSet as RMSNormSiluGateSavedSet
from cake_rmsnorm_silu_gate_det_train import (
    RMSNormSiluGateDetWorkspace as RMSNormSiluGateDetWorkspace,
)
from cake_rmsnorm_silu_gate_det_train import RMSNormSiluGateDetWorkspace as RMSNormSiluGateWorkspace
from cake_rmsnorm_silu_gate_det_train import __version__ as __version__
from cake_rmsnorm_silu_gate_det_train import make_plan as make_plan
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det as rmsnorm_silu_gate
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det as rmsnorm_silu_gate_det
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_bwd as rmsnorm_silu_gate_bwd
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_bwd as rmsnorm_silu_gate_det_bwd
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_fwd as rmsnorm_silu_gate_det_fwd
from cake_rmsnorm_silu_gate_det_train import rmsnorm_silu_gate_det_fwd as rmsnorm_silu_gate_fwd
from cake_rmsnorm_silu_gate_det_train import (
    rmsnorm_silu_gate_reference as rmsnorm_silu_gate_reference,
)

__all__ = [
    "RMSNormGated",
    "RMSNormSiluGateDetGrads",
    "RMSNormSiluGateDetPlan",
    "RMSNormSiluGateDetSavedSet",
    "RMSNormSiluGateDetWorkspace",
    "RMSNormSiluGateGrads",
    "RMSNormSiluGatePlan",
    "RMSNormSiluGateSavedSet",
    "RMSNormSiluGateWorkspace",
    "__version__",
    "make_plan",
    "rmsnorm_silu_gate",
    "rmsnorm_silu_gate_bwd",
    "rmsnorm_silu_gate_det",
    "rmsnorm_silu_gate_det_bwd",
    "rmsnorm_silu_gate_det_fwd",
    "rmsnorm_silu_gate_fwd",
    "rmsnorm_silu_gate_reference",
]
