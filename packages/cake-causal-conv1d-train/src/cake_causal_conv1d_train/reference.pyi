"""Type stub of the legacy name cake_causal_conv1d_train.reference:

cake_causal_conv1d_det_train.reference itself.
"""

from cake_causal_conv1d_det_train.reference import *  # noqa: F403
