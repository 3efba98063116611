"""Type stub of the legacy name cake_mhc_train.

``from cake_mhc_train import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_mhc_train import <old spelling>`` works); a star import does not bind it.
"""

from cake_mhc_det_train import HyperConnection as HyperConnection
from cake_mhc_det_train import MHCDetPlan as MHCDetPlan
from cake_mhc_det_train import MHCDetSavedSet as MHCDetSavedSet
from cake_mhc_det_train import MHCDetWorkspace as MHCDetWorkspace
from cake_mhc_det_train import __version__ as __version__
from cake_mhc_det_train import collapse_streams as collapse_streams
from cake_mhc_det_train import expand_streams as expand_streams
from cake_mhc_det_train import is_supported as is_supported
from cake_mhc_det_train import make_plan as make_plan
from cake_mhc_det_train import mhc_coefficients_reference as mhc_coefficients_reference
from cake_mhc_det_train import mhc_det_finish as mhc_det_finish
from cake_mhc_det_train import mhc_det_prepare as mhc_det_prepare
from cake_mhc_det_train import mhc_reference as mhc_reference
from cake_mhc_det_train import saved_bytes as saved_bytes
from cake_mhc_det_train import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
MHCPlan = MHCDetPlan
MHCSavedSet = MHCDetSavedSet
MHCWorkspace = MHCDetWorkspace
mhc_finish = mhc_det_finish
mhc_prepare = mhc_det_prepare

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
