"""Type stub of the legacy name cake_causal_conv1d_train.plan:

cake_causal_conv1d_det_train.plan itself.
"""

from cake_causal_conv1d_det_train.plan import *  # noqa: F403
