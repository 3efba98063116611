"""Type stub of the legacy name cake_lm_head_loss_train.kernels:

cake_lm_head_loss_det_train.kernels itself.
"""

from cake_lm_head_loss_det_train.kernels import *  # noqa: F403
