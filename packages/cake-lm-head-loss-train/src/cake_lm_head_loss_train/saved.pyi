"""Type stub of the legacy name cake_lm_head_loss_train.saved:

cake_lm_head_loss_det_train.saved itself.
"""

from cake_lm_head_loss_det_train.saved import *  # noqa: F403
