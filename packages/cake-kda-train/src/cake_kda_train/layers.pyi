"""Type stub of the legacy name cake_kda_train.layers:

cake_kda_det_train.layers itself.
"""

from cake_kda_det_train.layers import *  # noqa: F403
