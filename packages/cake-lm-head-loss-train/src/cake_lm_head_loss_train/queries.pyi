"""Type stub of the legacy name cake_lm_head_loss_train.queries:

cake_lm_head_loss_det_train.queries itself.
"""

from cake_lm_head_loss_det_train.queries import *  # noqa: F403
