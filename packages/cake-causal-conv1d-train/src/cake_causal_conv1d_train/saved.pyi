"""Type stub of the legacy name cake_causal_conv1d_train.saved:

cake_causal_conv1d_det_train.saved itself.
"""

from cake_causal_conv1d_det_train.saved import *  # noqa: F403
