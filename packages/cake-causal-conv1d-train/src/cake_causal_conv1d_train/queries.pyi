"""Type stub of the legacy name cake_causal_conv1d_train.queries:

cake_causal_conv1d_det_train.queries itself.
"""

from cake_causal_conv1d_det_train.queries import *  # noqa: F403
