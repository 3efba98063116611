"""Type stub of the legacy name cake_causal_conv1d_train.kernels:

cake_causal_conv1d_det_train.kernels itself.
"""

from cake_causal_conv1d_det_train.kernels import *  # noqa: F403
