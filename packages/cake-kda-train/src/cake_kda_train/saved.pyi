"""Type stub of the legacy name cake_kda_train.saved:

cake_kda_det_train.saved itself.
"""

from cake_kda_det_train.saved import *  # noqa: F403
