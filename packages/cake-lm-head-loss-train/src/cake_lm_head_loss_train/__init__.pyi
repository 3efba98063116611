"""Type stub of the legacy name cake_lm_head_loss_train.

``from cake_lm_head_loss_train import *`` binds the names of the runtime ``__all__``: the
canonical names. Each old spelling is bound to its canonical name below
(``from cake_lm_head_loss_train import <old spelling>`` works); a star import does not bind it.
"""

from cake_lm_head_loss_det_train import LMHeadLoss as LMHeadLoss
from cake_lm_head_loss_det_train import LMHeadLossDetGrads as LMHeadLossDetGrads
from cake_lm_head_loss_det_train import LMHeadLossDetPlan as LMHeadLossDetPlan
from cake_lm_head_loss_det_train import LMHeadLossDetSavedSet as LMHeadLossDetSavedSet
from cake_lm_head_loss_det_train import LMHeadLossDetWorkspace as LMHeadLossDetWorkspace
from cake_lm_head_loss_det_train import __version__ as __version__
from cake_lm_head_loss_det_train import is_supported as is_supported
from cake_lm_head_loss_det_train import lm_head_loss_det as lm_head_loss_det
from cake_lm_head_loss_det_train import lm_head_loss_det_bwd as lm_head_loss_det_bwd
from cake_lm_head_loss_det_train import lm_head_loss_det_fwd as lm_head_loss_det_fwd
from cake_lm_head_loss_det_train import lm_head_loss_reference as lm_head_loss_reference
from cake_lm_head_loss_det_train import make_plan as make_plan
from cake_lm_head_loss_det_train import saved_bytes as saved_bytes
from cake_lm_head_loss_det_train import workspace_bytes as workspace_bytes

# old spellings (the same objects; not in __all__)
LMHeadLossGrads = LMHeadLossDetGrads
LMHeadLossPlan = LMHeadLossDetPlan
LMHeadLossSavedSet = LMHeadLossDetSavedSet
LMHeadLossWorkspace = LMHeadLossDetWorkspace
lm_head_loss = lm_head_loss_det
lm_head_loss_bwd = lm_head_loss_det_bwd
lm_head_loss_fwd = lm_head_loss_det_fwd

__all__ = [
    "LMHeadLoss",
    "LMHeadLossDetGrads",
    "LMHeadLossDetPlan",
    "LMHeadLossDetSavedSet",
    "LMHeadLossDetWorkspace",
    "__version__",
    "is_supported",
    "lm_head_loss_det",
    "lm_head_loss_det_bwd",
    "lm_head_loss_det_fwd",
    "lm_head_loss_reference",
    "make_plan",
    "saved_bytes",
    "workspace_bytes",
]
