"""Type stub of the legacy name cake_lm_head_loss_train.modules:

cake_lm_head_loss_det_train.modules itself.
"""

from cake_lm_head_loss_det_train.modules import *  # noqa: F403
