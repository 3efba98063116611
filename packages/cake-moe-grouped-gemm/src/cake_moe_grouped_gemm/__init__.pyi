"""Type stub of the legacy name cake_moe_grouped_gemm."""

from cake_moe_grouped_det_gemm import MoEGroupedDetGrads as MoEGroupedDetGrads
from cake_moe_grouped_det_gemm import MoEGroupedDetGrads as MoEGroupedGrads
from cake_moe_grouped_det_gemm import MoEGroupedDetPlan as MoEGroupedDetPlan
from cake_moe_grouped_det_gemm import MoEGroupedDetPlan as MoEGroupedPlan
from cake_moe_grouped_det_gemm import MoEGroupedDetSavedSet as MoEGroupedDetSavedSet
from cake_moe_grouped_det_gemm import MoEGroupedDetSavedSet as MoEGroupedSavedSet
from cake_moe_grouped_det_gemm import MoEGroupedDetWorkspace as MoEGroupedDetWorkspace
from cake_moe_grouped_det_gemm import MoEGroupedDetWorkspace as MoEGroupedWorkspace
from cake_moe_grouped_det_gemm import __version__ as __version__
from cake_moe_grouped_det_gemm import make_plan as make_plan
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm as moe_grouped_det_gemm
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm as moe_grouped_gemm
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_bwd as moe_grouped_det_gemm_bwd
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_bwd as moe_grouped_gemm_bwd
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_fwd as moe_grouped_det_gemm_fwd
from cake_moe_grouped_det_gemm import moe_grouped_det_gemm_fwd as moe_grouped_gemm_fwd
from cake_moe_grouped_det_gemm import moe_grouped_gemm_reference as moe_grouped_gemm_reference

__all__ = [
    "MoEGroupedDetGrads",
    "MoEGroupedDetPlan",
    "MoEGroupedDetSavedSet",
    "MoEGroupedDetWorkspace",
    "MoEGroupedGrads",
    "MoEGroupedPlan",
    "MoEGroupedSavedSet",
    "MoEGroupedWorkspace",
    "__version__",
    "make_plan",
    "moe_grouped_det_gemm",
    "moe_grouped_det_gemm_bwd",
    "moe_grouped_det_gemm_fwd",
    "moe_grouped_gemm",
    "moe_grouped_gemm_bwd",
    "moe_grouped_gemm_fwd",
    "moe_grouped_gemm_reference",
]
