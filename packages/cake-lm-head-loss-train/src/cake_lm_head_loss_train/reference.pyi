"""Type stub of the legacy name cake_lm_head_loss_train.reference:

cake_lm_head_loss_det_train.reference itself.
"""

from cake_lm_head_loss_det_train.reference import *  # noqa: F403
