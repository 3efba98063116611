"""Type stub of the legacy name cake_lm_head_loss_train.plan:

cake_lm_head_loss_det_train.plan itself.
"""

from cake_lm_head_loss_det_train.plan import *  # noqa: F403
