"""Type stub of the legacy name cake_lm_head_loss_train."""

from cake_lm_head_loss_det_train import LMHeadLoss as LMHeadLoss
from cake_lm_head_loss_det_train import LMHeadLossDetGrads as LMHeadLossDetGrads
from cake_lm_head_loss_det_train import LMHeadLossDetGrads as LMHeadLossGrads
from cake_lm_head_loss_det_train import LMHeadLossDetPlan as LMHeadLossDetPlan
from cake_lm_head_loss_det_train import LMHeadLossDetPlan as LMHeadLossPlan
from cake_lm_head_loss_det_train import LMHeadLossDetSavedSet as LMHeadLossDetSavedSet
from cake_lm_head_loss_det_train import LMHeadLossDetSavedSet as LMHeadLossSavedSet
from cake_lm_head_loss_det_train import LMHeadLossDetWorkspace as LMHeadLossDetWorkspace
from cake_lm_head_loss_det_train import LMHeadLossDetWorkspace as LMHeadLossWorkspace
from cake_lm_head_loss_det_train import __version__ as __version__
from cake_lm_head_loss_det_train import lm_head_loss_det as lm_head_loss
from cake_lm_head_loss_det_train import lm_head_loss_det as lm_head_loss_det
from cake_lm_head_loss_det_train import lm_head_loss_det_bwd as lm_head_loss_bwd
from cake_lm_head_loss_det_train import lm_head_loss_det_bwd as lm_head_loss_det_bwd
from cake_lm_head_loss_det_train import lm_head_loss_det_fwd as lm_head_loss_det_fwd
from cake_lm_head_loss_det_train import lm_head_loss_det_fwd as lm_head_loss_fwd
from cake_lm_head_loss_det_train import lm_head_loss_reference as lm_head_loss_reference
from cake_lm_head_loss_det_train import make_plan as make_plan

__all__ = [
    "LMHeadLoss",
    "LMHeadLossDetGrads",
    "LMHeadLossDetPlan",
    "LMHeadLossDetSavedSet",
    "LMHeadLossDetWorkspace",
    "LMHeadLossGrads",
    "LMHeadLossPlan",
    "LMHeadLossSavedSet",
    "LMHeadLossWorkspace",
    "__version__",
    "lm_head_loss",
    "lm_head_loss_bwd",
    "lm_head_loss_det",
    "lm_head_loss_det_bwd",
    "lm_head_loss_det_fwd",
    "lm_head_loss_fwd",
    "lm_head_loss_reference",
    "make_plan",
]
