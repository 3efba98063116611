"""Type stub of the legacy name cake_causal_conv1d_train.modules:

cake_causal_conv1d_det_train.modules itself.
"""

from cake_causal_conv1d_det_train.modules import *  # noqa: F403
