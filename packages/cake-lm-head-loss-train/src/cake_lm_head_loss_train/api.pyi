"""Type stub of the legacy name cake_lm_head_loss_train.api:

cake_lm_head_loss_det_train.api itself.
"""

from cake_lm_head_loss_det_train.api import *  # noqa: F403
