"""Type stub of the legacy name cake_causal_conv1d_train.api:

cake_causal_conv1d_det_train.api itself.
"""

from cake_causal_conv1d_det_train.api import *  # noqa: F403
